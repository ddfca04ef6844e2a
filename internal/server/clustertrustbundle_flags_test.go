package server

import (
	"testing"

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
