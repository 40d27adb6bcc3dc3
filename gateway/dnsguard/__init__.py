"""The policy-aware DNS listener: the pod's queries answered under the principal's policy."""
