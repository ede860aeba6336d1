"""The platform: who am I in the job (launcher), process groups, cluster spec and rendering,
health check, deployment. Nothing here knows the training workload (app.train)."""
