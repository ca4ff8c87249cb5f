// Tiny static programs packed into the OCI images of the local end-to-end
// cluster (crates/e2e): no registry is reachable there, so the sandbox (pause)
// image and the test image are built here and imported into containerd.
// Standard library only, built with CGO_ENABLED=0 so they run in an empty rootfs.
module github.com/aws-dra/aws-dra-drivers/e2e/go/images

go 1.24.0
