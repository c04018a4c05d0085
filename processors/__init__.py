"""The control plane's pure decision core (detector, placement, autoscaler, lifecycle, policies)."""
