// Package helmtest checks deploy/helm/trustbridge, the Helm chart, with
// Helm's own Go packages (helm.sh/helm/v3: the chart loader, the values
// schema check and the template engine helm install runs):
//
//   - with default values the chart renders the same objects as the
//     kustomize base, deploy/base, as kubectl kustomize renders it (kinds,
//     names, namespaces, container, probes, security contexts, RBAC rules,
//     the server's config), so the two cannot drift;
//   - every value lands where values.yaml says (a Kubernetes field, or a
//     key of the server's config file that `trustbridge config check`
//     accepts);
//   - values the server would refuse fail rendering, naming the value;
//   - the chart's README.md lists every value with the comment above it
//     in values.yaml (readme.go; go test -run TestChartReadme -update
//     rewrites that section);
//   - helm template works without --kube-version, with Helm's built-in
//     default Kubernetes version;
//   - helm lint finds nothing worse than information;
//   - every rendering passes `kubectl apply --dry-run=server` against the
//     real API server tier (internal/testkit/kubetest).
//
// It is a module of its own so that Helm never enters trustbridge's
// dependency graph:
//
//	make helm-tests
//	# or, by hand:
//	cd deploy/helm/test && KUBEBUILDER_ASSETS=$PWD/../../../bin/kube TRUSTBRIDGE_BIN=$PWD/../../../bin/trustbridge go test ./...
//
// Without kubectl (bin/kube) or TRUSTBRIDGE_BIN the tests that need them
// skip, unless TRUSTBRIDGE_KUBE_TESTS=require, which fails them instead.
package helmtest
