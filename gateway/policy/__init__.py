"""Policy: typed objects, YAML loading with line numbers, hot reload, and the pure decision."""
