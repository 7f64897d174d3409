// Log Analytics and Application Insights. Local (key-based) authentication is off on both:
// the Functions host sends telemetry as the app's managed identity, which needs the
// Monitoring Metrics Publisher role on the component (app/rbac.bicep).

param logAnalyticsName string
param appInsightsName string
param location string = resourceGroup().location
param tags object = {}

@minValue(30)
@maxValue(730)
param retentionInDays int = 30

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true
    }
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    DisableLocalAuth: true
  }
}

output logAnalyticsName string = workspace.name
output appInsightsName string = appInsights.name
output appInsightsId string = appInsights.id
