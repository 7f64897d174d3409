// Service Bus namespace (Standard: scheduled messages and duplicate detection) with every queue
// the app uses. Local (SAS key) authentication is off: senders and receivers use Entra ID. With
// vnetEnabled the namespace is Premium (one messaging unit), the tier private endpoints need, and
// refuses every public network (docs/deploy.md, Private network, says what Premium costs).
//
// The queues and their properties are the same as in devstack/servicebus/Config.json, the
// development broker's entity config; tests/infra/checks.py fails when the two differ.
// Which app's identity reads each queue, and so gets Azure Service Bus Data Receiver on it
// (app/rbac.bicep): `receivedByPattern` marks the queues a Service Bus trigger of the pattern app
// consumes; `receivedByOperations` those the operations app reads: operator-alerts, which the
// operator API peeks and settles (an acknowledged alert is completed; others met on the way are
// deferred), and every queue whose dead letters it lists, replays or purges (a role on a queue
// covers its dead-letter sub-queue). tests/infra/checks.py derives both sets from each app's code.

param name string
param location string = resourceGroup().location
param tags object = {}

@description('Private network: Premium, public network access off, reached through a private endpoint only.')
param vnetEnabled bool = false

var standardSku = {
  name: 'Standard'
  tier: 'Standard'
}
var premiumSku = {
  name: 'Premium'
  tier: 'Premium'
  capacity: 1
}

var queues = [
  {
    name: 'orders' // submissions (OrderSubmitted) -> scheduler intake
    receivedByPattern: true
    receivedByOperations: true
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: true
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
  {
    name: 'scheduler-commands' // retry / resubmit / cancel -> scheduler
    receivedByPattern: true
    receivedByOperations: true
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: true
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
  {
    name: 'agent-responses' // agents -> scheduler
    receivedByPattern: true
    receivedByOperations: true
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: true
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
  {
    name: 'inventory-requests' // scheduler -> inventory agent
    receivedByPattern: true
    receivedByOperations: true
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: false
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
  {
    name: 'payment-requests' // scheduler -> payment agent
    receivedByPattern: true
    receivedByOperations: true
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: false
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
  {
    name: 'shipping-requests' // scheduler -> shipping agent
    receivedByPattern: true
    receivedByOperations: true
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: false
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
  {
    name: 'operator-alerts' // OperatorAlert -> people (an Azure Monitor alert fires while any waits)
    receivedByPattern: false
    receivedByOperations: true
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P14D'
      deadLetteringOnMessageExpiration: true
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
  {
    name: 'order-status' // default reply queue for submitters' StatusUpdate messages
    receivedByPattern: false
    receivedByOperations: false
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      defaultMessageTimeToLive: 'P1D'
      deadLetteringOnMessageExpiration: false
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'PT10M'
      requiresSession: false
    }
  }
]

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: vnetEnabled ? premiumSku : standardSku
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
  }
}

resource queueResources 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [for queue in queues: {
  parent: namespace
  name: queue.name
  properties: queue.properties
}]

output name string = namespace.name
output id string = namespace.id
// serviceBusEndpoint is https://<name>.<cloud suffix>:443/; the SDK and the host want the host name.
output fullyQualifiedNamespace string = split(split(namespace.properties.serviceBusEndpoint, '//')[1], ':')[0]
output queueNames array = [for (queue, i) in queues: queueResources[i].name]
output patternReceiveQueueNames array = [for queue in filter(queues, queue => queue.receivedByPattern): queue.name]
output operationsReceiveQueueNames array = [for queue in filter(queues, queue => queue.receivedByOperations): queue.name]
