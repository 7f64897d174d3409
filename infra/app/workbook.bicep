// The operators' Azure Monitor workbook: the dashboard overview's charts (orders started,
// finished and failed, step latency, retries, circuit state, Supervisor lag) plus invocations,
// failures and exceptions per function, drawn from the Application Insights component the app
// exports its OpenTelemetry metrics and the host its invocations to (docs/deploy.md, Workbook).
//
// The workbook itself is workbook.json, next to this file, so it is reviewed as JSON and can be
// pasted into the portal's Advanced Editor and back. Its queries name only metrics the code
// defines, and every metric the code defines has a chart (tests/infra checks both).
//
// A shared workbook is a resource in the resource group: whoever may read the resource group
// (or the workbook and the component) sees it. It needs no identity and no role assignment.

@description('Application Insights component the workbook reads (and is listed under).')
param appInsightsName string
param location string = resourceGroup().location
param tags object = {}
@description('Name the portal shows.')
param displayName string

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  // A workbook's name must be a GUID; derived from the component, so a redeployment updates
  // the same workbook instead of adding one.
  name: guid(appInsights.id, 'orders-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    // Lists it under the component's Workbooks, and makes the component the resource its
    // queries run against when opened from there.
    sourceId: appInsights.id
    // fallbackResourceIds: the same component when the workbook is opened with no resource
    // in context (its own page in the resource group, a link, a pinned part).
    serializedData: string(union(json(loadTextContent('workbook.json')), {
      fallbackResourceIds: [
        appInsights.id
      ]
    }))
  }
}

output id string = workbook.id
output name string = workbook.name
