// Storage account: the Functions host's own storage (AzureWebJobsStorage), the deployment
// package container Flex Consumption runs from, and the state store tables (the app's own data
// is all in Table Storage; it uses no blob). Shared keys are off: everything authenticates with
// Entra ID.

param name string
param location string = resourceGroup().location
param tags object = {}

@description('Blob container the Flex Consumption plan deploys the app package to.')
param deploymentContainerName string

// The state store's tables (app settings ORDERS_TABLE, ACTIVE_ORDERS_TABLE, SUPERVISION_TABLE in
// main.bicep): order state, the active-order index the Supervisor sweeps, and the Supervisor's
// per-bucket leases and checkpoints.
var tableNames = [
  'orders'
  'activeorders'
  'supervision'
]

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      defaultAction: 'Allow'
      bypass: 'AzureServices'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for tableName in tableNames: {
  parent: tableService
  name: tableName
}]

output name string = account.name
output id string = account.id
output tableEndpoint string = account.properties.primaryEndpoints.table
output tableNames array = tableNames
output deploymentContainerName string = deploymentContainer.name
