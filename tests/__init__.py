"""Test suite: unit, integration (Azurite + local Service Bus broker) and end to end."""
