"""Offline checks of infra/ (Bicep, parameters, azure.yaml) and the post-deploy smoke command."""
