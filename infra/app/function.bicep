// A function app on a Flex Consumption plan of its own (FC1: one app per plan), Python 3.11,
// running as its user-assigned managed identity. main.bicep deploys it twice from one package:
// the pattern app and the operations app. The runtime is set in functionAppConfig, not in app
// settings (Flex Consumption rejects FUNCTIONS_WORKER_RUNTIME and sets
// FUNCTIONS_EXTENSION_VERSION itself).

param name string
param planName string
param location string = resourceGroup().location
param tags object = {}

@description('Resource id of the user-assigned managed identity the app runs as.')
param identityId string
@description('Client id of that identity (the host and the SDK clients pick it by client id).')
param identityClientId string
param storageAccountName string
param deploymentContainerName string
param appInsightsName string

@description('The settings the app code reads (main.bicep); the connections\' identity is added here.')
param appSettings object

@maxValue(1000)
@minValue(1)
param maximumInstanceCount int = 100
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@minValue(0)
@maxValue(10)
@description('Always-ready instances for each agent function and scheduler_replies (0: none).')
param alwaysReadyInstances int = 0

@description('Spread the plan\'s instances over availability zones (regions with zones only).')
param zoneRedundant bool = false

@description('Subnet the app\'s outbound traffic goes through (the private network option), delegated to Microsoft.App/environments; empty: none.')
param subnetId string = ''

@description('Client id of the Entra ID app registration that signs operators in (App Service Authentication): the operations app\'s. Empty: authentication is not configured, and every HTTP request (operator API, dashboard) still needs a function key.')
param authClientId string = ''
@description('Tenant of that app registration. Empty: the tenant of this deployment.')
param authTenantId string = ''
@allowed([
  'AllowAnonymous'
  'RedirectToLoginPage'
  'Return401'
])
@description('What App Service Authentication does with a request that is not signed in. AllowAnonymous: it reaches the function, which still needs a function key, and an action is refused (no signed-in caller); the others: sign-in is required for reads too.')
param authUnauthenticatedAction string = 'AllowAnonymous'

// Functions whose first message after idle would otherwise wait for an instance (a cold
// start) while its step's queue budget runs: the agents and the reply handler.
var alwaysReadyFunctions = [
  'inventory_agent'
  'payment_agent'
  'shipping_agent'
  'scheduler_replies'
]

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

// The app's own identity for its connections: the host's Service Bus triggers and the app's SDK
// clients pick it by client id.
var identitySettings = {
  ServiceBusConnection__clientId: identityClientId
  StateStorage__clientId: identityClientId
}

// Settings of the Functions host itself (not read by the app code), all identity-based. The host
// storage is named by its service URIs, from the account itself: an account name alone makes the
// host assume the public cloud's host names. The host keeps its locks, timer schedules and keys in
// blobs and its diagnostic events in a table; it uses no storage queue here (no blob trigger, no
// Durable Functions), so it needs no queue service URI.
var hostSettings = {
  AzureWebJobsStorage__blobServiceUri: storage.properties.primaryEndpoints.blob
  AzureWebJobsStorage__tableServiceUri: storage.properties.primaryEndpoints.table
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsights.properties.ConnectionString
  // Entra ID authentication for telemetry (the component has local auth off). The host reads
  // it, and so does the Azure Monitor exporter in the Python worker (the app's own spans).
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
  // The Python worker makes the host's invocation span the current OpenTelemetry context in
  // each call, so the app's spans are its children (host.json telemetryMode OpenTelemetry;
  // docs/deploy.md, Telemetry).
  PYTHON_ENABLE_OPENTELEMETRY: 'true'
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225: zone redundancy follows the zoneRedundant parameter (off by default): it needs a region with availability zones, and there Flex Consumption keeps at least two always-ready instances per function group, billed all the time
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
    zoneRedundant: zoneRedundant
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_222: inbound stays public in both shapes: azd deploys each package through the app's publish endpoint, and the operations app serves operators wherever they are; every route needs a function key, actions a signed-in operator (docs/deploy.md, Private network)
  // checkov:skip=CKV_AZURE_17: client certificates would lock out the browsers the dashboard serves; callers present a function key and, for actions, an Entra ID sign-in
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales to zero by design; alwaysReadyInstances keeps instances warm where a cold start matters
  // checkov:skip=CKV_AZURE_213: Flex Consumption has no App Service health check (it replaces unhealthy instances itself); the Supervisor-not-running alert and GET /api/health watch the apps
  name: name
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    virtualNetworkSubnetId: empty(subnetId) ? null : subnetId
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
    }
    // Key Vault references in app settings resolve with the app identity.
    keyVaultReferenceIdentity: identityId
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
        alwaysReady: [
          for fn in (alwaysReadyInstances > 0 ? alwaysReadyFunctions : []): {
            name: 'function:${fn}'
            instanceCount: alwaysReadyInstances
          }
        ]
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// Checkov reads both sites/config children below as the site's 'web' configuration, which neither
// is: its findings on them are skipped as misread (the site itself is checked above).
resource appSettingsConfig 'Microsoft.Web/sites/config@2024-04-01' = {
  // checkov:skip=CKV_AZURE_13: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one holds the app settings
  // checkov:skip=CKV_AZURE_63: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one holds the app settings
  // checkov:skip=CKV_AZURE_65: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one holds the app settings
  // checkov:skip=CKV_AZURE_66: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one holds the app settings
  // checkov:skip=CKV_AZURE_80: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one holds the app settings
  // checkov:skip=CKV_AZURE_88: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one holds the app settings
  // checkov:skip=CKV_AZURE_222: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one holds the app settings
  parent: functionApp
  name: 'appsettings'
  properties: union(appSettings, identitySettings, hostSettings)
}

// App Service Authentication (Easy Auth) with Microsoft Entra ID, when an app registration is
// given. It signs operators in and sets X-MS-CLIENT-PRINCIPAL-NAME, which the operator API
// records as who acted and requires for every action; function keys still guard every route
// (authLevel function), so it adds to them and replaces nothing. Operators need the app role
// the registration defines, with assignment required (docs/deploy.md, Dashboard).
var authEnabled = !empty(authClientId)
var authIssuer = '${environment().authentication.loginEndpoint}${empty(authTenantId) ? tenant().tenantId : authTenantId}/v2.0'

resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = if (authEnabled) {
  // checkov:skip=CKV_AZURE_13: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one is App Service Authentication (authsettingsV2)
  // checkov:skip=CKV_AZURE_63: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one is App Service Authentication (authsettingsV2)
  // checkov:skip=CKV_AZURE_65: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one is App Service Authentication (authsettingsV2)
  // checkov:skip=CKV_AZURE_66: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one is App Service Authentication (authsettingsV2)
  // checkov:skip=CKV_AZURE_80: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one is App Service Authentication (authsettingsV2)
  // checkov:skip=CKV_AZURE_88: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one is App Service Authentication (authsettingsV2)
  // checkov:skip=CKV_AZURE_222: misread: Checkov takes every sites/config child for the site's 'web' configuration; this one is App Service Authentication (authsettingsV2)
  parent: functionApp
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: authUnauthenticatedAction != 'AllowAnonymous'
      unauthenticatedClientAction: authUnauthenticatedAction
      redirectToProvider: 'azureactivedirectory'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: authClientId
          openIdIssuer: authIssuer
        }
        validation: {
          allowedAudiences: [
            authClientId
            'api://${authClientId}'
          ]
        }
      }
    }
    login: {
      // The dashboard's views live in the URL fragment (#/order/<id>): keep it across sign-in.
      preserveUrlFragmentsForLogins: true
      tokenStore: {
        enabled: false
      }
    }
  }
}

output name string = functionApp.name
output id string = functionApp.id
output defaultHostName string = functionApp.properties.defaultHostName
output authEnabled bool = authEnabled
