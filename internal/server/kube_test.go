package server

import (
	"time"

	"github.com/trustbridge/trustbridge/ca/kubestore"
	"github.com/trustbridge/trustbridge/internal/kube/leader"
)

// fastKubeStorage is --storage kube in namespace ns with the default CA
// Secret and leader Lease and leader election timings short enough for
// tests.
func fastKubeStorage(ns string) KubeConfig {
	return KubeConfig{
		Storage: StorageKube, Namespace: ns, CASecret: kubestore.DefaultName, LeaderLease: leader.DefaultName,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond,
	}
}
