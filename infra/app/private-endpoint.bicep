// One private endpoint of the private network option (main.bicep's vnetEnabled), with the private
// DNS zone that resolves its service's host name to it inside the virtual network: the zone, its
// link to the network, the endpoint in the private endpoints subnet, and the endpoint's zone group
// (which writes and keeps the endpoint's A record in the zone). main.bicep deploys it once per
// service the apps reach.

@description('Name of the private endpoint.')
param name string
param location string = resourceGroup().location
param tags object = {}

@description('Resource id of the resource the endpoint reaches (a storage account, a key vault, a Service Bus namespace).')
param serviceId string

@allowed([
  'blob'
  'table'
  'queue'
  'vault'
  'namespace'
])
@description('Which of its services (the private link group id).')
param groupId string

@description('Private DNS zone of that service in the cloud of the deployment: privatelink.<service host suffix>.')
param dnsZoneName string

@description('Subnet the endpoint takes its private address in.')
param subnetId string

@description('Virtual network the zone is linked to (where the apps resolve host names).')
param virtualNetworkId string

resource zone 'Microsoft.Network/privateDnsZones@2024-06-01' = {
  name: dnsZoneName
  location: 'global'
  tags: tags
}

resource zoneLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = {
  parent: zone
  name: '${name}-link'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: virtualNetworkId
    }
  }
}

resource endpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: name
        properties: {
          privateLinkServiceId: serviceId
          groupIds: [
            groupId
          ]
        }
      }
    ]
  }
}

resource zoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: endpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: groupId
        properties: {
          privateDnsZoneId: zone.id
        }
      }
    ]
  }
}

output id string = endpoint.id
