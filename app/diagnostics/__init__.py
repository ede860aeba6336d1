"""Is the cluster healthy and fast? The rendezvous doctor, the health check, the collective
bandwidth sweep and the per-link matrix, with the collectives they measure."""
