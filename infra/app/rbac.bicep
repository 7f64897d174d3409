// Role assignments, least privilege. Data-plane roles only: no Owner, no Contributor, no
// Service Bus Data Owner, no role that can read keys or change the resources.
//
// The app's managed identity:
//   Storage Blob Data Owner         storage account  the Functions host (the app code's own blob
//                                                    use is the archive, below). The host's
//                                                    storage (AzureWebJobsStorage) keeps the timer
//                                                    trigger's schedule status and its singleton
//                                                    and host locks as blob leases and creates its
//                                                    containers, and the host reads the Flex
//                                                    deployment package; Owner is the role the
//                                                    Functions documentation requires for
//                                                    identity-based host storage
//   Storage Blob Data Contributor   archive container the purge (adapters/archive.py): reads the day
//                                                    blob's properties and block list, stages a
//                                                    block and commits the list, lists and reads
//                                                    day blobs to read an order back. Scoped to
//                                                    the one container, the narrowest scope a
//                                                    role assignment takes; it is the only blob
//                                                    access the app code needs, so narrowing the
//                                                    host's Owner role later keeps the purge
//                                                    working
//   Storage Table Data Contributor  storage account  the state store tables (orders, active-order
//                                                    index, the Supervisor's bucket leases); the
//                                                    host's diagnostic events table
//   Azure Service Bus Data Sender   namespace        requests, replies, commands, alerts, and
//                                                    status to any reply queue a submitter names
//   Azure Service Bus Data Receiver each queue with   the Service Bus triggers; the operator
//                                   receivedByApp    API's alerts (peek, receive, defer,
//                                                    complete) and dead letters (peek)
//   Monitoring Metrics Publisher    App Insights     telemetry (traces, logs, the Supervisor's
//                                                    metrics) with local auth off
// Each submitting application (submitterPrincipalIds):
//   Azure Service Bus Data Sender   orders queue     submit orders; no other queue: the internal
//                                                    queues take sends from the app identity
//                                                    only (and check signatures, service/inbound.py)
// The deploying principal (optional, for infra/smoke.py and the azd predeploy check):
//   Azure Service Bus Data Sender   orders queue     submit the smoke order
//   Storage Table Data Reader       orders table     watch it until Processed; the workflow
//                                                    check reads the Error index and the
//                                                    workflow of each Error order
//   Storage Table Data Reader       active-order     the workflow check (devstack/
//                                   index table      workflows_check.py) counts the versions
//                                                    of the orders in flight
//
// tests/infra/checks.py fails if any other role definition id appears in infra/.

param appPrincipalId string
param storageAccountName string
param serviceBusNamespaceName string
@description('Queues the app is triggered by (servicebus.bicep outputs them).')
param appReceiveQueueNames array
param appInsightsName string

@description('Deploying user or pipeline principal; empty: no role for it.')
param userPrincipalId string = ''
@description('Object ids of the applications (managed identities or service principals) that submit orders: each may send to the orders queue and nothing else.')
param submitterPrincipalIds array = []
@allowed([
  'User'
  'ServicePrincipal'
])
param userPrincipalType string = 'User'
@description('The queue the smoke test sends its order to.')
param submitQueueName string
@description('The table the smoke test reads the order state from.')
param ordersTableName string
param activeTableName string
@description('The container the purge archives orders to (ARCHIVE_CONTAINER).')
param archiveContainerName string

// Built-in role definition ids (the same in every tenant).
var roles = {
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageBlobDataContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  storageTableDataReader: '76199698-9eea-4c19-bc75-cec21354c6b6'
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource archiveContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: archiveContainerName
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource ordersTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: ordersTableName
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource receivedQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for queueName in appReceiveQueueNames: {
  parent: namespace
  name: queueName
}]

resource submitQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: namespace
  name: submitQueueName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

// ---------------------------------------------------------------- the app's managed identity

resource appBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appArchiveBlobDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(archiveContainer.id, appPrincipalId, roles.storageBlobDataContributor)
  scope: archiveContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, appPrincipalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appServiceBusSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace.id, appPrincipalId, roles.serviceBusDataSender)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource appServiceBusReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (queueName, i) in appReceiveQueueNames: {
  name: guid(receivedQueues[i].id, appPrincipalId, roles.serviceBusDataReceiver)
  scope: receivedQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource appMetricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, appPrincipalId, roles.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ----------------------------------------------- the applications that submit orders

resource submitterSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for submitter in submitterPrincipalIds: {
  name: guid(submitQueue.id, submitter, roles.serviceBusDataSender)
  scope: submitQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: submitter
    principalType: 'ServicePrincipal'
  }
}]

// ------------------------------------------------- the deploying principal (smoke test only)

resource userSubmitSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(submitQueue.id, userPrincipalId, roles.serviceBusDataSender)
  scope: submitQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}

resource activeTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: activeTableName
}

resource userActiveTableReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(activeTable.id, userPrincipalId, roles.storageTableDataReader)
  scope: activeTable
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataReader)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}

resource userOrdersTableReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(ordersTable.id, userPrincipalId, roles.storageTableDataReader)
  scope: ordersTable
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataReader)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}
