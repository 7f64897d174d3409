"""Test helpers: start and stop Azurite and the development Service Bus broker."""
