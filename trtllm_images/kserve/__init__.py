"""`build.py kserve`: the options, their checks, and the manifests of a KServe runtime, its pods, multi-node
groups and autoscaling."""
