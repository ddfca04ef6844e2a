package api

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

func TestSelectorString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sel  trustpolicy.Selector
		want string
	}{
		{trustpolicy.Selector{SPIFFEID: "spiffe://td/ns/a/*"}, "spiffe://td/ns/a/*"},
		{trustpolicy.Selector{Namespace: "a"}, "namespace=a"},
		{trustpolicy.Selector{SPIFFEID: "spiffe://td/x", Namespace: "a", Labels: &metav1.LabelSelector{MatchLabels: map[string]string{"b": "2", "a": "1"}}}, "spiffe://td/x namespace=a labels=a=1,b=2"},
	} {
		t.Run(tc.want, func(t *testing.T) { assert.Equal(t, tc.want, SelectorString(tc.sel)) })
	}
}
