// Role assignments, least privilege, per app: each app's identity gets the roles its own code
// needs, which tests/infra/checks.py derives from that app's code (what each function or route
// does to queues, tables, containers and secrets). Data-plane roles only: no Owner, no
// Contributor, no Service Bus Data Owner, no role that can read keys or change the resources.
//
// Both apps' identities (each app's Functions host and its code):
//   Storage Blob Data Owner         storage account  the Functions host. Its storage
//                                                    (AzureWebJobsStorage) keeps the timer
//                                                    trigger's schedule status, its singleton and
//                                                    host locks and its keys as blobs and creates
//                                                    its containers, and the host reads the Flex
//                                                    deployment package; Owner is the role the
//                                                    Functions documentation requires for
//                                                    identity-based host storage
//   Storage Table Data Contributor  storage account  the state store tables (orders, active-order
//                                                    index, the Supervisor's bucket leases); the
//                                                    host's diagnostic events table
//   Azure Service Bus Data Sender   namespace        the pattern app: requests, replies,
//                                                    commands, alerts, and status to any reply
//                                                    queue a submitter names; and what the
//                                                    operations app asks it to send
//   Azure Service Bus Data Sender   scheduler-       the operations app, and only there: never
//                                   commands queue   an agent's request queue. Its actions are
//                                                    written by it and sent by the pattern app,
//                                                    which it asks with a signed command, as it
//                                                    asks for each dead letter it replays
//                                                    (service/handover.py, service/replays.py)
//   Azure Service Bus Data Receiver each queue with   the pattern app's Service Bus triggers; the
//                                   receivedBy<App>  operations app's alerts (peek, receive,
//                                                    defer, complete) and dead letters (peek,
//                                                    settle) of every queue
//   Monitoring Metrics Publisher    App Insights     telemetry (traces, logs, the Supervisor's
//                                                    metrics) with local auth off
// The operations app's identity alone:
//   Storage Blob Data Contributor   archive container the retention purge (adapters/archive.py):
//                                                    its timer, POST /api/purge and the archive
//                                                    reads. Scoped to the one container, the
//                                                    narrowest scope a role assignment takes.
//                                                    (Each host's Blob Data Owner above spans the
//                                                    account, the archive too: the host storage
//                                                    shares the account with the app's state.)
// Each submitting application (submitterPrincipalIds):
//   Azure Service Bus Data Sender   orders queue     submit orders; no other queue: the internal
//                                                    queues take sends from the apps' identities
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
// tests/infra/checks.py fails if any other role definition id appears in infra/, if a role an
// app's code needs is missing, or if an app's identity holds one its code never uses.

@description('Principal id of the pattern app\'s identity.')
param patternPrincipalId string
@description('Principal id of the operations app\'s identity.')
param operationsPrincipalId string
param storageAccountName string
param serviceBusNamespaceName string
@description('Queues the pattern app\'s triggers read (servicebus.bicep outputs them).')
param patternReceiveQueueNames array
@description('Queues the operations app reads: alerts, and every queue\'s dead letters.')
param operationsReceiveQueueNames array
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
@description('The pattern app\'s commands queue: the one queue the operations app may send to.')
param commandsQueueName string
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

resource patternQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for queueName in patternReceiveQueueNames: {
  parent: namespace
  name: queueName
}]

resource operationsQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for queueName in operationsReceiveQueueNames: {
  parent: namespace
  name: queueName
}]

resource commandsQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: namespace
  name: commandsQueueName
}

resource submitQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: namespace
  name: submitQueueName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

// ------------------------------------------------------------------ the pattern app's identity

resource patternBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, patternPrincipalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: patternPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource patternTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, patternPrincipalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: patternPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource patternServiceBusSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace.id, patternPrincipalId, roles.serviceBusDataSender)
  scope: namespace
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: patternPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource patternServiceBusReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (queueName, i) in patternReceiveQueueNames: {
  name: guid(patternQueues[i].id, patternPrincipalId, roles.serviceBusDataReceiver)
  scope: patternQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: patternPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource patternMetricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, patternPrincipalId, roles.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: patternPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// --------------------------------------------------------------- the operations app's identity

resource operationsBlobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, operationsPrincipalId, roles.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
    principalId: operationsPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource operationsArchiveBlobDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(archiveContainer.id, operationsPrincipalId, roles.storageBlobDataContributor)
  scope: archiveContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    principalId: operationsPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource operationsTableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, operationsPrincipalId, roles.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
    principalId: operationsPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource operationsServiceBusSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(commandsQueue.id, operationsPrincipalId, roles.serviceBusDataSender)
  scope: commandsQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    principalId: operationsPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource operationsServiceBusReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (queueName, i) in operationsReceiveQueueNames: {
  name: guid(operationsQueues[i].id, operationsPrincipalId, roles.serviceBusDataReceiver)
  scope: operationsQueues[i]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
    principalId: operationsPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource operationsMetricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, operationsPrincipalId, roles.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
    principalId: operationsPrincipalId
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
