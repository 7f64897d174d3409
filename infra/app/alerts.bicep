// Azure Monitor alerts to the operators' email address:
// - an operator alert is waiting: ActiveMessages > 0 on the operator alerts queue;
// - a message was dead-lettered: DeadletteredMessages > 0 on any queue (one alert per queue,
//   split by the EntityName dimension).
// Both are stateful (autoMitigate): one email when the condition starts, one when it clears,
// i.e. when operators have drained the queue or its dead-letter queue.

param actionGroupName string
param tags object = {}
param alertEmail string
param serviceBusNamespaceName string
param operatorAlertsQueueName string

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: actionGroupName
  location: 'Global'
  tags: tags
  properties: {
    groupShortName: 'sas-ops'
    enabled: true
    emailReceivers: [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

resource operatorAlertWaiting 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'operator-alert-waiting-${namespace.name}'
  location: 'global'
  tags: tags
  properties: {
    description: 'An OperatorAlert is waiting on the ${operatorAlertsQueueName} queue: an order ended in Error or a message was rejected. Read it with the operator tools.'
    severity: 1
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'OperatorAlertsWaiting'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'ActiveMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                operatorAlertsQueueName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: actionGroup.id
      }
    ]
  }
}

resource deadLettered 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'dead-lettered-messages-${namespace.name}'
  location: 'global'
  tags: tags
  properties: {
    description: 'A queue has dead-lettered messages: a message failed MaxDeliveryCount times or expired. Inspect the queue\'s dead-letter queue.'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadLetteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: actionGroup.id
      }
    ]
  }
}

output actionGroupId string = actionGroup.id
