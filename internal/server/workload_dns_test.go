package server

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/workloaddns"
)

func TestWorkloadDNSNamesFlag(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	for _, tc := range []struct {
		name, template, td string
		dnsNames           []string
		wantErr            string
	}{
		{name: "off", template: ""},
		{name: "osm", template: "{sa}.{ns}.{td}"},
		{name: "kubernetes", template: "{sa}.{ns}.svc.cluster.local"},
		{name: "wildcard", template: "*.{ns}.svc", wantErr: "--workload-dns-name-template: "},
		{name: "no sa", template: "{ns}.svc", wantErr: "--workload-dns-name-template: "},
		{name: "no fixed zone", template: "{sa}.{ns}", wantErr: "must end in a fixed zone"},
		{name: "uppercase", template: "{sa}.{ns}.SVC", wantErr: "lowercase"},
		{name: "trust domain not a DNS name", template: "{sa}.{ns}.{td}", td: "my_org.example", wantErr: `--workload-dns-name-template: workload DNS name template "{sa}.{ns}.{td}": {td}: trust domain "my_org.example" is not a valid DNS name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := td
			if tc.td != "" {
				d = spiffeid.RequireTrustDomainFromString(tc.td)
			}
			tmpl, err := workloadDNSNames(GRPCConfig{WorkloadDNSNameTemplate: tc.template, DNSNames: tc.dnsNames}, d)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				assert.Nil(t, tmpl)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.template == "", tmpl == nil)
		})
	}
}

// TestWorkloadDNSNamesReserveGRPCNames: no workload gets a name of the
// certificate service's own certificate, which Istio agents check.
func TestWorkloadDNSNamesReserveGRPCNames(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	tmpl, err := workloadDNSNames(GRPCConfig{WorkloadDNSNameTemplate: "{sa}.{ns}.svc", DNSNames: []string{" istiod.istio-system.svc", ""}}, td)
	require.NoError(t, err)
	_, err = tmpl.Names(spiffeid.RequireFromPath(td, "/ns/istio-system/sa/istiod"),
		authn.Grant{Method: authn.MethodKubernetesJWT, Ref: "istio-system/istiod"})
	assert.ErrorIs(t, err, workloaddns.ErrSkipped)
	assert.ErrorContains(t, err, "reserved")
}
