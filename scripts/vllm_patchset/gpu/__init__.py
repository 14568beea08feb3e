"""GPU validation: red/green trees, the offline bundle, the native-ops kit."""
