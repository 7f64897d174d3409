"""Running the local stack: Azurite, the development broker, the fake services and hosts."""
