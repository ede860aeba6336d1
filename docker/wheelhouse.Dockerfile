# The host-filled wheelhouse (docker/imagebuild/wheelhouse.py) as an image, so that the
# workload build copies it from here and its own context stays small.
#
#   docker build -f docker/wheelhouse.Dockerfile -t ddp-cluster-wheels:cpu build/wheelhouse/cpu
FROM scratch
COPY . /wheelhouse/
