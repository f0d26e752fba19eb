"""digits_numpy: a Flower app that fits a linear classifier to scikit-learn's digits in NumPy."""
