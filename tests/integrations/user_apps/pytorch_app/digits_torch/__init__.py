"""digits_torch: a small Flower app that trains an MLP on scikit-learn's digits."""
