// Storage account: the Functions hosts' own storage (AzureWebJobsStorage), the deployment
// package container Flex Consumption runs each app from, the state store tables, and the archive of
// purged orders (block blobs of JSON lines, one per day, moved to cool storage by a lifecycle
// rule). Shared keys are off: everything authenticates with Entra ID. With vnetEnabled the account
// refuses every public network and the apps reach its blob and table services through private
// endpoints (main.bicep); without, it takes any network and Entra ID alone guards it.

param name string
param location string = resourceGroup().location
param tags object = {}

@description('Blob containers the Flex Consumption plans deploy the apps\' packages to, one per app.')
param deploymentContainerNames array

@minValue(0)
@maxValue(3650)
@description('Days after its last append that a day blob of the order archive moves to cool storage.')
param archiveCoolAfterDays int = 30

@description('Private network: public network access off, reached through private endpoints only.')
param vnetEnabled bool = false

@description('Zone-redundant storage (ZRS) instead of locally redundant (LRS): regions with availability zones only.')
param zoneRedundant bool = false

// The state store's tables (app settings ORDERS_TABLE, ACTIVE_ORDERS_TABLE, SUPERVISION_TABLE in
// main.bicep): order state, the active-order index the Supervisor sweeps, and the Supervisor's
// per-bucket leases and checkpoints.
var tableNames = [
  'orders'
  'activeorders'
  'supervision'
]

// The archive of purged orders (app setting ARCHIVE_CONTAINER in main.bicep; adapters/archive.py).
var archiveContainerName = 'order-archive'

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_206: redundancy is the zoneRedundant parameter's (ZRS in regions with availability zones, LRS by default); geo-replication (GRS) is not offered: the state store has no failover to a paired region, and some allowed regions have no pair
  // checkov:skip=CKV_AZURE_59: public shape only: vnetEnabled false keeps public network access on, as the apps have no private path then (tests/infra checks both shapes)
  // checkov:skip=CKV_AZURE_35: public shape only: vnetEnabled false lets every network in (default action Allow), as the apps have no private path then (tests/infra checks both shapes)
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: zoneRedundant ? 'Standard_ZRS' : 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
    networkAcls: {
      defaultAction: vnetEnabled ? 'Deny' : 'Allow'
      bypass: 'AzureServices'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource deploymentContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for container in deploymentContainerNames: {
  parent: blobService
  name: container
  properties: {
    publicAccess: 'None'
  }
}]

resource archiveContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: archiveContainerName
  properties: {
    publicAccess: 'None'
  }
}

// The purge appends to one block blob per day and never reads it again: once a day blob has not
// changed for archiveCoolAfterDays it moves to the cool tier (block blobs only: append blobs
// have no tiers, which is why the archive uses block blobs).
resource lifecycle 'Microsoft.Storage/storageAccounts/managementPolicies@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    policy: {
      rules: [
        {
          name: 'order-archive-to-cool'
          enabled: true
          type: 'Lifecycle'
          definition: {
            filters: {
              blobTypes: [
                'blockBlob'
              ]
              prefixMatch: [
                '${archiveContainerName}/'
              ]
            }
            actions: {
              baseBlob: {
                tierToCool: {
                  daysAfterModificationGreaterThan: archiveCoolAfterDays
                }
              }
            }
          }
        }
      ]
    }
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
output blobEndpoint string = account.properties.primaryEndpoints.blob
output archiveContainerName string = archiveContainer.name
output tableNames array = tableNames
