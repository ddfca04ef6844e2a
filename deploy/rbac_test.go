package deploy

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/kubetest"
)

// The server's service account may do to ClusterFederatedTrustDomain
// resources exactly what the server does: the controller watches them
// and writes their status; federation add|remove and bundle set through
// the admin API create, update and delete them (federation/crd/manage.go).
// These ran into 403 on a real install when the role granted only reads.
func TestServerRBACClusterFederatedTrustDomains(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "trustbridge-system"
	env.Apply(t, []string{ns}, kubetest.LoadManifests(t, "rbac"))
	sa := "system:serviceaccount:" + ns + ":trustbridge"

	tests := []struct {
		verb, subresource string
		allowed           bool
	}{
		{"get", "", true}, {"list", "", true}, {"watch", "", true},
		{"create", "", true}, {"update", "", true}, {"delete", "", true},
		{"update", "status", true}, {"patch", "status", true},
		// Nothing the server does not do.
		{"patch", "", false}, {"deletecollection", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.verb+"/"+tt.subresource, func(t *testing.T) {
			review, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authzv1.SubjectAccessReview{
				Spec: authzv1.SubjectAccessReviewSpec{
					User:   sa,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
					ResourceAttributes: &authzv1.ResourceAttributes{
						Group: "trustbridge.dev", Resource: "clusterfederatedtrustdomains", Subresource: tt.subresource,
						Verb: tt.verb, Name: "east.example",
					},
				},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.Equal(t, tt.allowed, review.Status.Allowed, "%s: %s", tt.verb, review.Status.Reason)
		})
	}
}
