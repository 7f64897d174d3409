// The Key Vault holding the key the app signs its internal messages with (domain/signing.py).
// RBAC authorization only (no access policies); each app's identity may read this one secret and
// nothing else in the vault. The app setting MESSAGE_SIGNING_KEYS is a Key Vault reference to
// the secret's latest version, which the platform resolves with each app's identity: the pattern
// app signs and checks its messages with it, the operations app signs what its actions send and
// checks dead letters before a replay. With vnetEnabled the vault refuses every public network and
// the platform resolves the reference through the vault's private endpoint (main.bicep); the secret
// itself is written by the deployment through Azure Resource Manager, which network rules do not
// apply to.

param name string
param location string = resourceGroup().location
param tags object = {}

@description('Principal id of the pattern app\'s identity, granted Key Vault Secrets User on the secret only.')
param patternPrincipalId string

@description('Principal id of the operations app\'s identity, granted Key Vault Secrets User on the secret only.')
param operationsPrincipalId string

@description('Id of the key that signs (the first in MESSAGE_SIGNING_KEYS).')
param signingKeyId string

@secure()
@description('Random secret of the signing key (azd generates it once; see main.bicep).')
param signingSecret string

@secure()
@description('Keys still accepted during a rotation, "<id>:<base64>[,...]"; empty when none.')
param retiringSigningKeys string = ''

@description('Private network: public network access off, reached through a private endpoint only.')
param vnetEnabled bool = false

var keyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6'
var signingKey = '${signingKeyId}:${base64(signingSecret)}'

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_110: purge protection off on purpose (see enableSoftDelete below): `azd down --purge` must be able to remove the vault, and the one secret is regenerable
  // checkov:skip=CKV_AZURE_42: recoverable: soft delete is on (7 days); Checkov wants purge protection too, off as said for CKV_AZURE_110
  // checkov:skip=CKV_AZURE_109: public shape only: vnetEnabled false lets every network in, as the apps have no private path then (tests/infra checks both shapes)
  // checkov:skip=CKV_AZURE_189: public shape only: vnetEnabled false keeps public network access on, as the apps have no private path then (tests/infra checks both shapes)
  name: name
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    // Soft delete without purge protection: `azd down --purge` can remove the vault, and the
    // secret is regenerable (a new key only means a rotation).
    enableSoftDelete: true
    softDeleteRetentionInDays: 7
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
    networkAcls: {
      defaultAction: vnetEnabled ? 'Deny' : 'Allow'
      bypass: 'AzureServices'
    }
  }
}

resource signingKeys 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  // checkov:skip=CKV_AZURE_41: no expiry date: the signing key ends at a rotation the operators run (messageSigningKeyId, retiringSigningKeys: docs/deploy.md, Trusted messages and key rotation), not on a calendar date that would stop every signed message
  parent: vault
  name: 'message-signing-keys'
  properties: {
    value: empty(retiringSigningKeys) ? signingKey : '${signingKey},${retiringSigningKeys}'
    contentType: 'MESSAGE_SIGNING_KEYS: <key id>:<base64 secret>, newest first'
  }
}

resource patternReadsSigningKeys 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(signingKeys.id, patternPrincipalId, keyVaultSecretsUser)
  scope: signingKeys
  properties: {
    principalId: patternPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
  }
}

resource operationsReadsSigningKeys 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(signingKeys.id, operationsPrincipalId, keyVaultSecretsUser)
  scope: signingKeys
  properties: {
    principalId: operationsPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
  }
}

output id string = vault.id
output name string = vault.name
output signingKeysSecretUri string = signingKeys.properties.secretUri
