// Scheduler Agent Supervisor on Azure Functions: everything one environment needs.
//
// `azd up` deploys this file with infra/main.parameters.json; without azd:
//   az deployment sub create --location <region> --template-file infra/main.bicep \
//     --parameters environmentName=<name> location=<region> alertEmail=<address> ...
// (docs/deploy.md lists every parameter). No secret is created, stored or passed: every
// connection is Microsoft Entra ID with a user-assigned managed identity.
//
// Two function apps, from one package (docs/architecture.md, Two apps): the pattern app
// (function_app.py: the Scheduler, the Agents, the Supervisor; Service Bus and timer triggers
// only, no HTTP function) and the operations app (operations_app.py, chosen by the Python
// worker's PYTHON_SCRIPT_FILE_NAME: the operator API, the dashboard and the retention purge).
// Each runs as an identity of its own, with the settings and the roles its own code needs
// (app/rbac.bicep).
//
// tests/infra checks this template offline against the code: every app setting the code reads
// is set below and nothing else is, queue and table names agree with the Service Bus and
// storage modules, devstack/servicebus/Config.json and local.settings.json.example, only the
// allowed roles are granted, the Supervisor alerts query the metrics the code emits, and the
// workbook charts exactly the metrics the code defines.

targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('Name of the azd environment. With the subscription and location it makes the resource names unique.')
param environmentName string

// The regions the official azd Flex Consumption samples allow (Azure-Samples/
// functions-quickstart-python-http-azd, infra/main.bicep, commit 7ed4638 of 2025-11-24);
// `az functionapp list-flexconsumption-locations` prints today's list. A region where Flex
// Consumption arrives later (a sovereign cloud's included: nothing else here is tied to one cloud)
// is one more line.
@minLength(1)
@description('Region for every resource: one that offers the Flex Consumption plan.')
@allowed([
  'australiaeast'
  'australiasoutheast'
  'brazilsouth'
  'canadacentral'
  'centralindia'
  'centralus'
  'eastasia'
  'eastus'
  'eastus2'
  'eastus2euap'
  'francecentral'
  'germanywestcentral'
  'italynorth'
  'japaneast'
  'koreacentral'
  'northcentralus'
  'northeurope'
  'norwayeast'
  'southafricanorth'
  'southcentralus'
  'southeastasia'
  'southindia'
  'spaincentral'
  'swedencentral'
  'uaenorth'
  'uksouth'
  'ukwest'
  'westcentralus'
  'westeurope'
  'westus'
  'westus2'
  'westus3'
])
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Private network (VNET_ENABLED): both apps reach the storage account, Key Vault and Service Bus through private endpoints in a virtual network of this deployment, and those three refuse every public network. Service Bus is then Premium (its private endpoints need it; see docs/deploy.md for the cost). false (the default): public endpoints, each guarded by Entra ID alone.')
param vnetEnabled bool = false

@description('Zone redundancy (ZONE_REDUNDANT): both Flex Consumption plans spread their instances over availability zones, and the storage account is zone-redundant (ZRS). Only in regions with availability zones; the platform then keeps at least two always-ready instances per function group, billed as always ready (docs/deploy.md, Cost).')
param zoneRedundant bool = false

@description('Object id of the deploying user or pipeline principal (azd sets AZURE_PRINCIPAL_ID). It gets the data roles the smoke test needs: send to the orders queue, read the orders table. Empty: no role for anyone but the app.')
param principalId string = ''

@description('Object ids of the applications (managed identities or service principals) that submit orders. Each gets Azure Service Bus Data Sender on the orders queue only.')
param submitterPrincipalIds array = []

@allowed([
  'User'
  'ServicePrincipal'
])
@description('Kind of principalId.')
param principalType string = 'User'

@minLength(3)
@description('Email address of the operators: Azure Monitor alerts (operator alert waiting, dead-lettered messages, Supervisor lagging or not running) go there.')
param alertEmail string

@minLength(11)
@description('NCRONTAB schedule of the Supervisor timer, six fields, seconds first, in UTC (Flex Consumption has no WEBSITE_TIME_ZONE). It must fire at a fixed interval: */N seconds, 0 */N * * * * minutes, and so on.')
param supervisorSchedule string = '*/15 * * * * *'

@minLength(1)
@description('Buckets of the active-order index one Supervisor instance sweeps concurrently per tick (a positive integer).')
param supervisorConcurrency string = '4'

@minLength(1)
@description('Failed attempts after which the Supervisor stops retrying an order, compensates its completed steps and alerts an operator.')
param failureThreshold string = '3'

@minLength(8)
@description('Base URL of the inventory service (outside this deployment).')
param inventoryServiceUrl string

@minLength(8)
@description('Base URL of the payment service (outside this deployment).')
param paymentServiceUrl string

@minLength(8)
@description('Base URL of the shipping service (outside this deployment).')
param shippingServiceUrl string

@description('Seconds without progress after which the Supervisor bumps a Pending order.')
param pendingStaleAfterSeconds string = '120'

@description('Budget of one step attempt in seconds, for every step. Empty: each step keeps its workflow budget.')
param stepTimeoutSeconds string = ''

@description('How long a step request may wait for its agent (a backlog, a cold start) before the attempt budget starts, in seconds, for every step. Empty: each step keeps its workflow queue budget.')
param stepQueueSeconds string = ''

@description('First retry delay in seconds. Empty: the workflow default.')
param retryBaseDelaySeconds string = ''

@description('Longest retry delay in seconds. Empty: the workflow default.')
param retryMaxDelaySeconds string = ''

@description('How long, from when an order starts to compensate, an undo that fails transiently or times out is retried before the order ends in Error with the effect left in place, in seconds. Empty: 21600 (6 hours). Keep it well inside how long the remote services keep idempotency keys and tombstones (docs/remote-service-contract.md).')
param compensationBudgetSeconds string = ''

@description('An order still compensating after this many seconds raises one warning alert (compensation_delayed). Empty: 600 (10 minutes); it must be less than the compensation budget.')
param compensationWarnAfterSeconds string = ''

@description('How far the clocks of two hosts of the app may disagree, in seconds: the Supervisor acts on a deadline another host stamped only once its own clock is past it by this much, so no order is recovered early. Every recovery waits this long past its deadline. Empty: 10; at most 300.')
param clockSkewToleranceSeconds string = ''

@description('Longest one call of an agent to its remote service may take, in seconds (adapters/remote_http.py). Empty: 10.')
param remoteTimeoutSeconds string = ''

@description('Most calls one worker has under way to each remote service at once (adapters/remote_http.py). Empty: 32.')
param remoteMaxConnections string = ''

@description('Version new orders take per workflow, NAME=VERSION separated by commas (e.g. order=2); empty: version 1 of each.')
param workflowVersions string = ''

@minValue(0)
@maxValue(3650)
@description('Days a finished order (Processed, or Error once its terminal alert was acknowledged) is kept after it last changed; then the retention timer archives it to Blob Storage and deletes it. 0: the timer purges nothing (operators still can, with POST /api/purge).')
param retentionDays int = 30

@minLength(11)
@description('NCRONTAB schedule of the retention purge, six fields, seconds first, in UTC.')
param purgeSchedule string = '0 30 2 * * *'

@minValue(0)
@maxValue(3650)
@description('Days after its last append that a day blob of the order archive moves to cool storage.')
param archiveCoolAfterDays int = 30

@minValue(1)
@description('Alert when the Supervisor finds an order that has been due longer than this many seconds (metric supervisor.lag). Keep it well above one Supervisor period.')
param supervisorLagAlertSeconds int = 120

@maxValue(1000)
@minValue(1)
@description('Most Flex Consumption instances the pattern app may scale out to.')
param maximumInstanceCount int = 100

@maxValue(1000)
@minValue(1)
@description('Most Flex Consumption instances the operations app (operator API, dashboard) may scale out to: it serves people, not queues.')
param operationsMaximumInstanceCount int = 40

@allowed([
  512
  2048
  4096
])
@description('Memory of one Flex Consumption instance, in MB.')
param instanceMemoryMB int = 2048

@secure()
@metadata({
  azd: {
    type: 'generate'
    config: {
      length: 48
    }
  }
})
@description('Secret of the key that signs internal messages. azd generates it on the first `azd up` and reuses it (.azure/<env>/config.json); see docs/deploy.md to rotate it.')
param messageSigningSecret string

@minLength(1)
@maxLength(32)
@description('Id of that key, carried in every signature (change it when you rotate).')
param messageSigningKeyId string = 'k1'

@secure()
@description('During a rotation, the previous keys ("<id>:<base64>[,...]"), still accepted; empty otherwise.')
param retiringSigningKeys string = ''

@minValue(0)
@maxValue(10)
@description('Always-ready instances for each agent function and for scheduler_replies (0: scale to zero, cold starts). See docs/deploy.md.')
param alwaysReadyInstances int = 0

@description('Client id of the Entra ID app registration for App Service Authentication (operators sign in to the dashboard and the operator API). Empty: not configured; function keys alone guard the HTTP functions, and actions are refused for want of a signed-in caller. See docs/deploy.md, Dashboard.')
param authClientId string = ''

@description('Tenant of that app registration. Empty: the tenant of this deployment.')
param authTenantId string = ''

@allowed([
  'AllowAnonymous'
  'RedirectToLoginPage'
  'Return401'
])
@description('With authClientId: what happens to a request that is not signed in. AllowAnonymous (the default): it reaches the function, which still needs a function key; reads work, actions need a signed-in operator. RedirectToLoginPage or Return401: sign-in is required for reads too.')
param authUnauthenticatedAction string = 'AllowAnonymous'

var abbrs = loadJsonContent('abbreviations.json')
var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
// azure.yaml's services; azd finds each function app by its azd-service-name tag.
var patternService = 'pattern'
var operationsService = 'operations'
// Each app's deployment package (Flex Consumption runs each app from a container of its own).
var patternPackageContainer = 'app-package'
var operationsPackageContainer = 'operations-package'

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: '${abbrs.resourcesResourceGroups}${environmentName}'
  location: location
  tags: tags
}

module patternIdentity 'app/identity.bicep' = {
  name: 'pattern-identity'
  scope: rg
  params: {
    name: '${abbrs.managedIdentityUserAssignedIdentities}${resourceToken}'
    location: location
    tags: tags
  }
}

module operationsIdentity 'app/identity.bicep' = {
  name: 'operations-identity'
  scope: rg
  params: {
    name: '${abbrs.managedIdentityUserAssignedIdentities}ops-${resourceToken}'
    location: location
    tags: tags
  }
}

module storage 'app/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    name: '${abbrs.storageStorageAccounts}${resourceToken}'
    location: location
    tags: tags
    deploymentContainerNames: [
      patternPackageContainer
      operationsPackageContainer
    ]
    archiveCoolAfterDays: archiveCoolAfterDays
    vnetEnabled: vnetEnabled
    zoneRedundant: zoneRedundant
  }
}

module serviceBus 'app/servicebus.bicep' = {
  name: 'servicebus'
  scope: rg
  params: {
    name: '${abbrs.serviceBusNamespaces}${resourceToken}'
    location: location
    tags: tags
    vnetEnabled: vnetEnabled
  }
}

module keyVault 'app/keyvault.bicep' = {
  name: 'keyvault'
  scope: rg
  params: {
    name: '${abbrs.keyVaultVaults}${resourceToken}'
    location: location
    tags: tags
    patternPrincipalId: patternIdentity.outputs.principalId
    operationsPrincipalId: operationsIdentity.outputs.principalId
    signingKeyId: messageSigningKeyId
    signingSecret: messageSigningSecret
    retiringSigningKeys: retiringSigningKeys
    vnetEnabled: vnetEnabled
  }
}

// The private network (vnetEnabled): one virtual network, each app's outbound traffic through a
// subnet of its own, and a private endpoint (with its private DNS zone) for each service the apps
// reach: the storage account's blob and table services (the apps' state and archive, their hosts'
// storage and deployment packages; no app or host uses its queues or files), Key Vault (the
// platform resolves MESSAGE_SIGNING_KEYS through it) and the Service Bus namespace. Each zone's
// name comes from the cloud the deployment runs in, not from a literal host name.
module network 'app/network.bicep' = if (vnetEnabled) {
  name: 'network'
  scope: rg
  params: {
    name: '${abbrs.networkVirtualNetworks}${resourceToken}'
    securityGroupName: '${abbrs.networkNetworkSecurityGroups}${resourceToken}'
    location: location
    tags: tags
  }
}

module blobEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'blob-endpoint'
  scope: rg
  params: {
    name: '${abbrs.networkPrivateEndpoints}blob-${resourceToken}'
    location: location
    tags: tags
    serviceId: storage.outputs.id
    groupId: 'blob'
    dnsZoneName: 'privatelink.blob.${environment().suffixes.storage}'
    subnetId: vnetEnabled ? network.outputs.privateEndpointSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.id : ''
  }
}

module tableEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'table-endpoint'
  scope: rg
  params: {
    name: '${abbrs.networkPrivateEndpoints}table-${resourceToken}'
    location: location
    tags: tags
    serviceId: storage.outputs.id
    groupId: 'table'
    dnsZoneName: 'privatelink.table.${environment().suffixes.storage}'
    subnetId: vnetEnabled ? network.outputs.privateEndpointSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.id : ''
  }
}

module vaultEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'vault-endpoint'
  scope: rg
  params: {
    name: '${abbrs.networkPrivateEndpoints}vault-${resourceToken}'
    location: location
    tags: tags
    serviceId: keyVault.outputs.id
    groupId: 'vault'
    // keyvaultDns is '.vault.<cloud suffix>'; the private zone is 'privatelink.vaultcore.<suffix>'.
    dnsZoneName: 'privatelink${replace(environment().suffixes.keyvaultDns, '.vault.', '.vaultcore.')}'
    subnetId: vnetEnabled ? network.outputs.privateEndpointSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.id : ''
  }
}

module serviceBusEndpoint 'app/private-endpoint.bicep' = if (vnetEnabled) {
  name: 'servicebus-endpoint'
  scope: rg
  params: {
    name: '${abbrs.networkPrivateEndpoints}servicebus-${resourceToken}'
    location: location
    tags: tags
    serviceId: serviceBus.outputs.id
    groupId: 'namespace'
    // The namespace's host name less its own name: the cloud's Service Bus suffix.
    dnsZoneName: 'privatelink.${skip(serviceBus.outputs.fullyQualifiedNamespace, length(serviceBus.outputs.name) + 1)}'
    subnetId: vnetEnabled ? network.outputs.privateEndpointSubnetId : ''
    virtualNetworkId: vnetEnabled ? network.outputs.id : ''
  }
}

module monitoring 'app/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    logAnalyticsName: '${abbrs.operationalInsightsWorkspaces}${resourceToken}'
    appInsightsName: '${abbrs.insightsComponents}${resourceToken}'
    location: location
    tags: tags
  }
}

// The operators' charts in Azure: the dashboard overview's, from the metrics the app exports.
module workbook 'app/workbook.bicep' = {
  name: 'workbook'
  scope: rg
  params: {
    appInsightsName: monitoring.outputs.appInsightsName
    location: location
    tags: tags
    displayName: 'Orders (${environmentName})'
  }
}

// Every app setting the code of both apps reads (adapters/settings.py, the %NAME% binding
// expressions); retentionSettings, the operations app's alone. Each app's identity (the
// connections' __clientId) and the Functions host's own settings (AzureWebJobsStorage__*,
// APPLICATIONINSIGHTS_*) are added in app/function.bicep.
var appSettings = {
  // Service Bus, through the app's managed identity (no connection string anywhere);
  // adapters/settings.py reads the namespace and the client id.
  ServiceBusConnection__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
  // The state store's tables, through the app's managed identity.
  StateStorage__tableServiceUri: storage.outputs.tableEndpoint
  // Queues: names declared in app/servicebus.bicep and devstack/servicebus/Config.json.
  ORDERS_QUEUE: 'orders'
  SCHEDULER_COMMANDS_QUEUE: 'scheduler-commands'
  AGENT_RESPONSES_QUEUE: 'agent-responses'
  OPERATOR_ALERTS_QUEUE: 'operator-alerts'
  INVENTORY_REQUESTS_QUEUE: 'inventory-requests'
  PAYMENT_REQUESTS_QUEUE: 'payment-requests'
  SHIPPING_REQUESTS_QUEUE: 'shipping-requests'
  // Tables: declared in app/storage.bicep.
  ORDERS_TABLE: 'orders'
  ACTIVE_ORDERS_TABLE: 'activeorders'
  SUPERVISION_TABLE: 'supervision'
  // The remote services the agents call.
  INVENTORY_SERVICE_URL: inventoryServiceUrl
  PAYMENT_SERVICE_URL: paymentServiceUrl
  SHIPPING_SERVICE_URL: shippingServiceUrl
  // Supervisor and retry tuning. An empty value means "the code's default".
  SUPERVISOR_SCHEDULE: supervisorSchedule
  SUPERVISOR_CONCURRENCY: supervisorConcurrency
  FAILURE_THRESHOLD: failureThreshold
  PENDING_STALE_AFTER_SECONDS: pendingStaleAfterSeconds
  STEP_TIMEOUT_SECONDS: stepTimeoutSeconds
  STEP_QUEUE_SECONDS: stepQueueSeconds
  RETRY_BASE_DELAY_SECONDS: retryBaseDelaySeconds
  RETRY_MAX_DELAY_SECONDS: retryMaxDelaySeconds
  COMPENSATION_BUDGET_SECONDS: compensationBudgetSeconds
  COMPENSATION_WARN_AFTER_SECONDS: compensationWarnAfterSeconds
  CLOCK_SKEW_TOLERANCE_SECONDS: clockSkewToleranceSeconds
  // The agents' calls to their remote services (adapters/remote_http.py).
  REMOTE_TIMEOUT_SECONDS: remoteTimeoutSeconds
  REMOTE_MAX_CONNECTIONS: remoteMaxConnections
  WORKFLOW_VERSIONS: workflowVersions
  // The keys internal messages are signed with: a Key Vault reference, resolved by the
  // platform with the app identity (function.bicep sets keyVaultReferenceIdentity).
  MESSAGE_SIGNING_KEYS: '@Microsoft.KeyVault(SecretUri=${keyVault.outputs.signingKeysSecretUri})'
}

// The retention purge's settings: the operations app's alone (its timer and POST /api/purge run
// there; the pattern app's code reads none of them).
var retentionSettings = {
  // The state store's blobs, through the app's managed identity: the archive of purged orders.
  StateStorage__blobServiceUri: storage.outputs.blobEndpoint
  // The archive of purged orders: declared in app/storage.bicep.
  ARCHIVE_CONTAINER: 'order-archive'
  // What the code accepts is what the parameters allow (0-3650 days).
  RETENTION_DAYS: string(retentionDays)
  PURGE_SCHEDULE: purgeSchedule
}

module rbac 'app/rbac.bicep' = {
  name: 'rbac'
  scope: rg
  params: {
    patternPrincipalId: patternIdentity.outputs.principalId
    operationsPrincipalId: operationsIdentity.outputs.principalId
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.name
    patternReceiveQueueNames: serviceBus.outputs.patternReceiveQueueNames
    operationsReceiveQueueNames: serviceBus.outputs.operationsReceiveQueueNames
    appInsightsName: monitoring.outputs.appInsightsName
    userPrincipalId: principalId
    userPrincipalType: principalType
    submitterPrincipalIds: submitterPrincipalIds
    commandsQueueName: appSettings.SCHEDULER_COMMANDS_QUEUE
    submitQueueName: appSettings.ORDERS_QUEUE
    ordersTableName: appSettings.ORDERS_TABLE
    activeTableName: appSettings.ACTIVE_ORDERS_TABLE
    archiveContainerName: retentionSettings.ARCHIVE_CONTAINER
  }
}

// The pattern app: the host's Service Bus extension reads the connection's credential kind.
module pattern 'app/function.bicep' = {
  name: 'pattern-app'
  scope: rg
  // The host starts as soon as the app exists: grant its roles first, and (vnetEnabled) open
  // its private paths, or Key Vault references and the host storage fail at start.
  dependsOn: [
    rbac
    keyVault
    blobEndpoint
    tableEndpoint
    vaultEndpoint
    serviceBusEndpoint
  ]
  params: {
    name: '${abbrs.webSitesFunctions}${resourceToken}'
    planName: '${abbrs.webServerFarms}${resourceToken}'
    location: location
    tags: union(tags, {
      'azd-service-name': patternService
    })
    identityId: patternIdentity.outputs.id
    identityClientId: patternIdentity.outputs.clientId
    storageAccountName: storage.outputs.name
    deploymentContainerName: patternPackageContainer
    appInsightsName: monitoring.outputs.appInsightsName
    appSettings: union(appSettings, {
      ServiceBusConnection__credential: 'managedidentity'
    })
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    alwaysReadyInstances: alwaysReadyInstances
    zoneRedundant: zoneRedundant
    subnetId: vnetEnabled ? network.outputs.patternSubnetId : ''
  }
}

// The operations app: the same package, its entry chosen by the Python worker's
// PYTHON_SCRIPT_FILE_NAME, so its instances import only the operator surface and the retention
// purge. App Service Authentication signs operators in here; the pattern app serves no HTTP.
module operations 'app/function.bicep' = {
  name: 'operations-app'
  scope: rg
  dependsOn: [
    rbac
    keyVault
    blobEndpoint
    tableEndpoint
    vaultEndpoint
    serviceBusEndpoint
  ]
  params: {
    name: '${abbrs.webSitesFunctions}ops-${resourceToken}'
    planName: '${abbrs.webServerFarms}ops-${resourceToken}'
    location: location
    tags: union(tags, {
      'azd-service-name': operationsService
    })
    identityId: operationsIdentity.outputs.id
    identityClientId: operationsIdentity.outputs.clientId
    storageAccountName: storage.outputs.name
    deploymentContainerName: operationsPackageContainer
    appInsightsName: monitoring.outputs.appInsightsName
    appSettings: union(appSettings, retentionSettings, {
      PYTHON_SCRIPT_FILE_NAME: 'operations_app.py'
    })
    maximumInstanceCount: operationsMaximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    zoneRedundant: zoneRedundant
    subnetId: vnetEnabled ? network.outputs.operationsSubnetId : ''
    authClientId: authClientId
    authTenantId: authTenantId
    authUnauthenticatedAction: authUnauthenticatedAction
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  scope: rg
  params: {
    actionGroupName: '${abbrs.insightsActionGroups}${resourceToken}'
    location: location
    tags: tags
    alertEmail: alertEmail
    serviceBusNamespaceName: serviceBus.outputs.name
    operatorAlertsQueueName: appSettings.OPERATOR_ALERTS_QUEUE
    appInsightsName: monitoring.outputs.appInsightsName
    supervisorLagAlertSeconds: supervisorLagAlertSeconds
  }
}

// What azd stores in the environment (`azd env get-values`) and the smoke test reads.
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output SERVICE_PATTERN_NAME string = pattern.outputs.name
output SERVICE_OPERATIONS_NAME string = operations.outputs.name
output AZURE_FUNCTION_APP_NAME string = pattern.outputs.name
output AZURE_OPERATIONS_APP_NAME string = operations.outputs.name
output AZURE_MANAGED_IDENTITY_CLIENT_ID string = patternIdentity.outputs.clientId
output AZURE_OPERATIONS_IDENTITY_CLIENT_ID string = operationsIdentity.outputs.clientId
output SERVICEBUS_NAMESPACE_NAME string = serviceBus.outputs.name
output SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output AZURE_KEY_VAULT_NAME string = keyVault.outputs.name
output AZURE_STORAGE_ACCOUNT_NAME string = storage.outputs.name
output AZURE_STORAGE_TABLE_ENDPOINT string = storage.outputs.tableEndpoint
output APPLICATIONINSIGHTS_NAME string = monitoring.outputs.appInsightsName
output ORDERS_QUEUE string = appSettings.ORDERS_QUEUE
output ORDERS_TABLE string = appSettings.ORDERS_TABLE
output ACTIVE_ORDERS_TABLE string = appSettings.ACTIVE_ORDERS_TABLE
output OPERATOR_ALERTS_QUEUE string = appSettings.OPERATOR_ALERTS_QUEUE
// The operator HTTP API and the dashboard: the operations app (`orderctl --azd-env` reads it).
output AZURE_OPERATIONS_APP_URL string = 'https://${operations.outputs.defaultHostName}/api/'
output DASHBOARD_URL string = 'https://${operations.outputs.defaultHostName}/api/dashboard'
output AUTH_ENABLED bool = operations.outputs.authEnabled
// Whether the storage account, Key Vault and Service Bus refuse public networks (docs/deploy.md,
// Private network: what then runs only from inside the virtual network).
output VNET_ENABLED bool = vnetEnabled
// The workbook in the portal (docs/deploy.md, Workbook).
output WORKBOOK_URL string = '${environment().portal}/#@${tenant().tenantId}/resource${workbook.outputs.id}'
