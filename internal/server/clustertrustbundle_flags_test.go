package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestClusterTrustBundleSignerFlag(t *testing.T) {
	o := Config{Kube: KubeConfig{TrustBundleSigner: "trustbridge.io/svid", Storage: StorageFile}}
	assert.ErrorContains(t, checkStorageFlags(o), "--cluster-trust-bundle-signer needs --storage kube")
	o.Kube.Storage = StorageKube
	assert.NoError(t, checkStorageFlags(o))
	o.Kube.TrustBundleSigner = "svid"
	assert.ErrorContains(t, checkStorageFlags(o), `--cluster-trust-bundle-signer: signer name "svid": want DOMAIN/PATH with one slash, e.g. trustbridge.io/svid`)
}

func TestPodCertificateSignerFlags(t *testing.T) {
	o := Config{MaxWorkloadTTL: 24 * time.Hour, Kube: KubeConfig{PodCertSigner: "trustbridge.io/svid", Storage: StorageFile}}
	assert.ErrorContains(t, checkStorageFlags(o), "--pod-certificate-signer needs --storage kube")
	o.Kube.Storage = StorageKube
	assert.ErrorContains(t, checkStorageFlags(o), "needs --pod-certificate-namespaces SELECTOR")
	o.Kube.PodCertNamespaces = "a in (("
	assert.ErrorContains(t, checkStorageFlags(o), "--pod-certificate-namespaces")
	o.Kube.PodCertNamespaces = "kubernetes.io/metadata.name in (shop)"
	assert.NoError(t, checkStorageFlags(o))
	o.MaxWorkloadTTL = 30 * time.Minute
	assert.ErrorContains(t, checkStorageFlags(o), "--max-workload-ttl of at least 1h")
	o.MaxWorkloadTTL = 24 * time.Hour
	o.Kube.PodCertSigner = "kubernetes.io/kube-apiserver-client-pod"
	assert.ErrorContains(t, checkStorageFlags(o), "are Kubernetes' own")
	o.Kube.PodCertSigner, o.Kube.PodCertNamespaces = "", "x=y"
	assert.ErrorContains(t, checkStorageFlags(o), "--pod-certificate-namespaces needs --pod-certificate-signer")
}
