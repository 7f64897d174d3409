// Service Bus namespace (Standard: scheduled messages and duplicate detection) with every queue
// the app uses. Local (SAS key) authentication is off: senders and receivers use Entra ID.
//
// The queues and their properties are the same as in devstack/servicebus/Config.json, the
// development broker's entity config; tests/infra/checks.py fails when the two differ.
// `receivedByApp` marks the queues the app's identity reads: those a Service Bus trigger
// consumes, and operator-alerts, which the operator API peeks and settles (an acknowledged
// alert is completed; others met on the way are deferred). The operator API also peeks the
// dead-letter sub-queue of each of these queues, which a role on the queue covers. The identity
// gets Azure Service Bus Data Receiver on exactly those (app/rbac.bicep); tests/infra/checks.py
// derives the set from the code.

param name string
param location string = resourceGroup().location
param tags object = {}

var queues = [
  {
    name: 'orders' // submissions (OrderSubmitted) -> scheduler intake
    receivedByApp: true
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
    receivedByApp: true
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
    receivedByApp: true
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
    receivedByApp: true
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
    receivedByApp: true
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
    receivedByApp: true
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
    receivedByApp: true
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
    receivedByApp: false
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
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
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
output appReceiveQueueNames array = map(filter(queues, queue => queue.receivedByApp), queue => queue.name)
