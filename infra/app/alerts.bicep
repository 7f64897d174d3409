// Azure Monitor alerts to the operators' email address:
// - an operator alert is waiting: ActiveMessages > 0 on the operator alerts queue;
// - a message was dead-lettered: DeadletteredMessages > 0 on any queue (one alert per queue,
//   split by the EntityName dimension);
// - the Supervisor lags: its supervisor.lag metric (how long the most overdue order had been
//   due when a tick found it, in seconds) went over supervisorLagAlertSeconds;
// - the Supervisor is not running: no supervisor.tick.duration metric for 15 minutes (every
//   completed tick records one, whether or not it found work).
// The first two are metric alerts on the Service Bus namespace. The Supervisor's metrics are
// OpenTelemetry metrics the app exports to Application Insights (service/sweep_metrics.py), where
// they land in the customMetrics table under their own names, so those two are log search
// alerts on the Application Insights component. All four are stateful (autoMitigate): one
// email when the condition starts, one when it clears.

param actionGroupName string
@description('Region of the log search alert rules (metric alerts and the action group are global).')
param location string = resourceGroup().location
param tags object = {}
param alertEmail string
param serviceBusNamespaceName string
param operatorAlertsQueueName string
@description('Application Insights component the app exports its telemetry to.')
param appInsightsName string
@minValue(1)
@description('Alert when supervisor.lag exceeds this many seconds.')
param supervisorLagAlertSeconds int = 120

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
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
    description: 'An OperatorAlert is waiting on the ${operatorAlertsQueueName} queue: an order ended in Error, has been compensating for long, or a message was rejected. Read it with the operator tools.'
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

// Largest supervisor.lag value over the last 10 minutes, evaluated every 5: the window overlaps
// the previous one so that a value ingested late is still seen. Each instance re-exports its
// latest lag about every minute, so a Supervisor that keeps finding old work keeps it firing.
resource supervisorLag 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'supervisor-lag-${appInsights.name}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Supervisor lag over ${supervisorLagAlertSeconds} s'
    description: 'The Supervisor found an order that had been due for more than ${supervisorLagAlertSeconds} s (metric supervisor.lag): stalled orders are recovered late. Look for a failing or slow Supervisor (its logs, supervisor.buckets_unfinished) or a schedule too slow for the load.'
    severity: 2
    enabled: true
    scopes: [
      appInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT10M'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "supervisor.lag"'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'value'
          operator: 'GreaterThan'
          threshold: supervisorLagAlertSeconds
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

// Fewer than one supervisor.tick.duration row in 15 minutes: no Supervisor tick completed
// (the app is stopped or not deployed, the timer does not fire, or every tick fails). A
// schedule slower than about every 10 minutes would trip it; widen windowSize with it.
resource supervisorSilent 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'supervisor-not-running-${appInsights.name}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Supervisor not running'
    description: 'No Supervisor tick completed in 15 minutes (no supervisor.tick.duration metric): nothing recovers stalled orders. Check that the function app runs, the supervisor function is enabled and its logs for failing ticks.'
    severity: 1
    enabled: true
    scopes: [
      appInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "supervisor.tick.duration"'
          timeAggregation: 'Count'
          operator: 'LessThan'
          threshold: 1
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

output actionGroupId string = actionGroup.id
