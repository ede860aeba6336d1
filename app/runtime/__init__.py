"""Inside a job: who this process is (launcher, the ONE module that reads the environment), the
environment-variable contract, Slurm host lists, names and interfaces, process groups, running
a command again on local ranks, and torchrun's agent with its ranks forked from a preloaded
server. The lowest floor: it imports nothing else of app but its errors."""
