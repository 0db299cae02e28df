"""The rule definitions, one module per area (gpu, training, fabric, stack): each holds its
alerts (and the recording rules they read) with the config keys they use beside them."""
