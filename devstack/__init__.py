"""Local development stack (not deployed): dev Service Bus broker, fake services, tooling."""
