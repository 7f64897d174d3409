"""Development broker that speaks the Service Bus AMQP dialect (local use only)."""
