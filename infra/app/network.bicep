// The virtual network of the private network option (main.bicep's vnetEnabled): a subnet for the
// private endpoints (app/private-endpoint.bicep) and one outbound integration subnet per function
// app, delegated to Microsoft.App/environments as Flex Consumption requires. With it, each app's
// outbound traffic enters the network (Flex Consumption routes all of it there), so the private
// DNS zones linked to the network resolve the storage account, Key Vault and Service Bus to their
// private endpoints; traffic to anything else (the remote services, Application Insights) leaves
// through the network's default outbound path.
//
// The address space is fixed here: change it if it overlaps a network you peer with. Each app's
// subnet is a /24, sized for the default instance limits (100 and 40) with room to spare; an app
// scales out within its subnet's addresses, so widen it before raising maximumInstanceCount far.

param name string
@description('Network security group of every subnet: the default rules only (traffic within the network and outbound allowed, inbound from the internet denied), which landing zones usually require on each subnet.')
param securityGroupName string
param location string = resourceGroup().location
param tags object = {}

var privateEndpointSubnetName = 'private-endpoints'
var patternSubnetName = 'pattern-app'
var operationsSubnetName = 'operations-app'
var flexConsumptionDelegation = [
  {
    name: 'flex-consumption'
    properties: {
      serviceName: 'Microsoft.App/environments'
    }
  }
]

resource securityGroup 'Microsoft.Network/networkSecurityGroups@2024-05-01' = {
  name: securityGroupName
  location: location
  tags: tags
  properties: {
    securityRules: []
  }
}

resource vnet 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        '10.0.0.0/16'
      ]
    }
    subnets: [
      {
        name: privateEndpointSubnetName
        properties: {
          addressPrefix: '10.0.1.0/24'
          networkSecurityGroup: {
            id: securityGroup.id
          }
          privateEndpointNetworkPolicies: 'Disabled'
        }
      }
      {
        name: patternSubnetName
        properties: {
          addressPrefix: '10.0.2.0/24'
          networkSecurityGroup: {
            id: securityGroup.id
          }
          delegations: flexConsumptionDelegation
        }
      }
      {
        name: operationsSubnetName
        properties: {
          addressPrefix: '10.0.3.0/24'
          networkSecurityGroup: {
            id: securityGroup.id
          }
          delegations: flexConsumptionDelegation
        }
      }
    ]
  }
}

output id string = vnet.id
output name string = vnet.name
output privateEndpointSubnetId string = '${vnet.id}/subnets/${privateEndpointSubnetName}'
output patternSubnetId string = '${vnet.id}/subnets/${patternSubnetName}'
output operationsSubnetId string = '${vnet.id}/subnets/${operationsSubnetName}'
