# Sourced by build.sh and build-kubelet.sh: the version stamp of Kubernetes ${K8S_GIT_VERSION}
# built from its Go modules. Sets K8S_MAJOR, K8S_MINOR and K8S_VERSION_LDFLAGS (the -X flags of
# component-base's and client-go's version packages, as a release build stamps them).
ver="${K8S_GIT_VERSION#v}"
K8S_MAJOR="${ver%%.*}"
rest="${ver#*.}"
K8S_MINOR="${rest%%.*}"
# Release date of the k8s.io/kubernetes module version, from the module proxy's .info (stable).
build_date="$(cd / && go mod download -json "k8s.io/kubernetes@${K8S_GIT_VERSION}" \
  | sed -n 's/.*"Info": "\(.*\)".*/\1/p' | xargs cat | sed -n 's/.*"Time":"\([^"]*\)".*/\1/p')"
build_date="${build_date:-1970-01-01T00:00:00Z}"
# The module proxy does not carry the git commit; stamp an all-zero sha rather than a made-up one.
git_commit="0000000000000000000000000000000000000000"
K8S_VERSION_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_VERSION_LDFLAGS+=" -X ${pkg}.gitMajor=${K8S_MAJOR} -X ${pkg}.gitMinor=${K8S_MINOR}"
  K8S_VERSION_LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_GIT_VERSION} -X ${pkg}.gitCommit=${git_commit}"
  K8S_VERSION_LDFLAGS+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${build_date}"
done
