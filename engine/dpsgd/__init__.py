"""DP-SGD (Abadi et al. 2016): Poisson sampling, per-example clipping, Gaussian noise."""
