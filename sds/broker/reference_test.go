package broker

import (
	"strings"
	"testing"

	brokerpb "github.com/spiffe/go-spiffe/v2/exp/proto/spiffe/broker"
	spiretypes "github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestParseReference(t *testing.T) {
	got, err := ParseReference(pidRef(t, 42))
	require.NoError(t, err)
	assert.Equal(t, Reference{PID: 42}, got)

	got, err = ParseReference(podRef(t, "shop", "web-1", webUID))
	require.NoError(t, err)
	assert.Equal(t, &PodReference{Namespace: "shop", Name: "web-1", UID: webUID}, got.Pod)
	assert.Equal(t, "pod shop/web-1 (uid "+webUID+")", got.String())

	// As SPIRE and ztunnel send them (package spiffe.reference).
	b, err := proto.Marshal(&brokerpb.WorkloadPIDReference{Pid: 42})
	require.NoError(t, err)
	got, err = ParseReference(&brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: pidReferenceTypeSPIRE, Value: b}})
	require.NoError(t, err)
	assert.Equal(t, Reference{PID: 42}, got)
	got, err = ParseReference(spiffeReferencePod(t, "shop", "web-1", webUID))
	require.NoError(t, err)
	assert.Equal(t, &PodReference{Namespace: "shop", Name: "web-1", UID: webUID}, got.Pod)
	got, err = ParseReference(spiffeReferencePod(t, "", "", webUID))
	require.NoError(t, err)
	assert.Equal(t, &PodReference{UID: webUID}, got.Pod)

	got, err = ParseReference(accountRef(t, "shop", "web", ""))
	require.NoError(t, err)
	assert.Equal(t, &AccountReference{Namespace: "shop", Name: "web"}, got.Account)

	got, err = ParseReference(podRef(t, "", "", webUID))
	require.NoError(t, err)
	assert.Equal(t, "pod uid "+webUID, got.String())

	kube := func(plural, group string) *brokerpb.WorkloadReference {
		a, err := anypb.New(&brokerpb.KubernetesObjectReference{
			Type: &brokerpb.KubernetesObjectType{Plural: plural, Group: group},
			Key:  &brokerpb.KubernetesObjectKey{Namespace: "shop", Name: "web"},
		})
		require.NoError(t, err)
		return &brokerpb.WorkloadReference{Reference: a}
	}
	withUnknown := func() *brokerpb.WorkloadReference {
		b, err := proto.Marshal(&brokerpb.WorkloadPIDReference{Pid: 42})
		require.NoError(t, err)
		b = append(b, 0x10, 0x01) // field 2, varint 1
		return &brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: pidReferenceType, Value: b}}
	}
	for name, tc := range map[string]struct {
		ref  *brokerpb.WorkloadReference
		want string
	}{
		"nil":                 {nil, "no workload reference"},
		"zero pid":            {pidRef(t, 0), "must be positive"},
		"negative pid":        {pidRef(t, -1), "must be positive"},
		"deployment":          {kube("deployments", "apps"), `"deployments" in group "apps" is not served`},
		"account by uid":      {accountRef(t, "shop", "web", webUID), "by its key (namespace and name) only"},
		"account bad name":    {accountRef(t, "shop", "", ""), "needs both its namespace and its name"},
		"pods of other group": {kube("pods", "example.com"), "is not served"},
		"pod without key/uid": {podRef(t, "", "", ""), "needs its uid"},
		"name without ns":     {podRef(t, "", "web", ""), "needs both its namespace and its name"},
		"bad namespace":       {podRef(t, "Shop", "web", ""), `namespace "Shop"`},
		"bad uid":             {podRef(t, "", "", "not-a-uid"), "want a UUID"},
		"upper-case uid":      {podRef(t, "", "", strings.ToUpper(webUID)), "lower-case hex"},
		"unknown type":        {&brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: "type.googleapis.com/acme.Container"}}, `"type.googleapis.com/acme.Container" is not served`},
		"unknown fields":      {withUnknown(), "fields this server does not know"},
		"garbage":             {&brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: pidReferenceType, Value: []byte{0xff}}}, pidReferenceType},
		"spiffe.reference unknown field": {&brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: k8sReferenceTypeSPIRE,
			Value: protowire.AppendString(protowire.AppendTag(nil, 9, protowire.BytesType), "x")}}, "unknown field 9"},
		"spiffe.reference varint": {&brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: k8sReferenceTypeSPIRE,
			Value: protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 1)}}, "want length-delimited"},
		"spiffe.reference deployment": {spiffeReferenceDeployment(t), "is not served"},
		"too large":                   {&brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: pidReferenceType, Value: make([]byte, maxReferenceSize+1)}}, "at most"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseReference(tc.ref)
			require.ErrorIs(t, err, ErrInvalidReference)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// spiffeReferencePod is a Pod reference as SPIRE's protos encode it:
// resource = 1 {plural = 1, group = 2}, namespace = 2, name = 3, uid = 4.
func spiffeReferencePod(t testing.TB, ns, name, uid string) *brokerpb.WorkloadReference {
	return spiffeReference(t, "pods", "core", ns, name, uid)
}

func spiffeReferenceDeployment(t testing.TB) *brokerpb.WorkloadReference {
	return spiffeReference(t, "deployments", "apps", "shop", "web", "")
}

func spiffeReference(t testing.TB, plural, group, ns, name, uid string) *brokerpb.WorkloadReference {
	t.Helper()
	var res []byte
	res = protowire.AppendString(protowire.AppendTag(res, 1, protowire.BytesType), plural)
	res = protowire.AppendString(protowire.AppendTag(res, 2, protowire.BytesType), group)
	b := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), res)
	for i, v := range []string{ns, name, uid} {
		if v != "" {
			b = protowire.AppendString(protowire.AppendTag(b, protowire.Number(i+2), protowire.BytesType), v)
		}
	}
	return &brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: k8sReferenceTypeSPIRE, Value: b}}
}

func accountRef(t testing.TB, ns, name, uid string) *brokerpb.WorkloadReference {
	a, err := anypb.New(&brokerpb.KubernetesObjectReference{
		Type: &brokerpb.KubernetesObjectType{Plural: "serviceaccounts", Group: "core"},
		Key:  &brokerpb.KubernetesObjectKey{Namespace: ns, Name: name}, Uid: uid,
	})
	require.NoError(t, err)
	return &brokerpb.WorkloadReference{Reference: a}
}

func sel(values ...string) []*spiretypes.Selector {
	var out []*spiretypes.Selector
	for _, v := range values {
		typ, val, _ := strings.Cut(v, ":")
		out = append(out, &spiretypes.Selector{Type: typ, Value: val})
	}
	return out
}

func TestParseDelegated(t *testing.T) {
	got, err := ParseDelegated(42, nil)
	require.NoError(t, err)
	assert.Equal(t, Reference{PID: 42}, got)

	got, err = ParseDelegated(0, sel("k8s:ns:shop", "k8s:pod-name:web-1", "k8s:sa:web", "k8s:pod-label:app:web", "k8s:node-name:n1"))
	require.NoError(t, err)
	assert.Equal(t, &PodReference{Namespace: "shop", Name: "web-1"}, got.Pod)
	assert.Equal(t, []Check{
		{Kind: "service_account", Value: "web", Selector: "k8s:sa:web"},
		{Kind: "pod_label", Key: "app", Value: "web", Selector: "k8s:pod-label:app:web"},
		{Kind: "node_name", Value: "n1", Selector: "k8s:node-name:n1"},
	}, got.Checks)

	// ztunnel's selector mode: a namespace and a service account.
	got, err = ParseDelegated(0, sel("k8s:ns:shop", "k8s:sa:web", "k8s:pod-label:app:web"))
	require.NoError(t, err)
	assert.Equal(t, &AccountReference{Namespace: "shop", Name: "web"}, got.Account)
	assert.Nil(t, got.Pod)
	assert.Equal(t, []Check{{Kind: "pod_label", Key: "app", Value: "web", Selector: "k8s:pod-label:app:web"}}, got.Checks)
	assert.Equal(t, "service account shop/web", got.String())

	got, err = ParseDelegated(0, sel("k8s:pod-uid:"+webUID))
	require.NoError(t, err)
	assert.Equal(t, webUID, got.Pod.UID)

	many := make([]string, maxSelectors+1)
	for i := range many {
		many[i] = "k8s:pod-uid:" + webUID
	}
	for name, tc := range map[string]struct {
		pid  int32
		sels []*spiretypes.Selector
		want string
	}{
		"neither":         {0, nil, "either selectors or non-zero pid"},
		"both":            {1, sel("k8s:pod-uid:" + webUID), "but not both"},
		"negative":        {-3, nil, "must be positive"},
		"unix":            {0, sel("unix:uid:0"), `selector "unix:uid:0": only k8s selectors`},
		"unmapped k8s":    {0, sel("k8s:container-name:app", "k8s:pod-uid:"+webUID), `"k8s:container-name:app" does not map`},
		"namespace only":  {0, sel("k8s:ns:shop"), "name no pod and no service account"},
		"account only":    {0, sel("k8s:sa:web"), "name no pod and no service account"},
		"bad account":     {0, sel("k8s:ns:shop", "k8s:sa:Web"), `service account "Web"`},
		"name without ns": {0, sel("k8s:pod-name:web"), "needs both its namespace"},
		"contradiction":   {0, sel("k8s:ns:shop", "k8s:ns:other", "k8s:pod-name:web"), "contradicts"},
		"bad label":       {0, sel("k8s:pod-label:nocolon", "k8s:pod-uid:"+webUID), "k8s:pod-label:<name>:<value>"},
		"too many":        {0, sel(many...), "at most"},
		"oversized":       {0, sel("k8s:pod-name:" + strings.Repeat("a", maxSelectorSize)), "at most"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseDelegated(tc.pid, tc.sels)
			require.ErrorIs(t, err, ErrInvalidReference)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestPolicy(t *testing.T) {
	p, err := ParsePolicy([]string{"sa:istio-system/ztunnel", "uid:1337", "spiffe://a.test/ns/kube-system/sa/cilium"})
	require.NoError(t, err)
	for _, tc := range []struct {
		c    Caller
		rule string
	}{
		{Caller{ServiceAccount: "istio-system/ztunnel", UID: 5}, "sa:istio-system/ztunnel"},
		{Caller{UID: 1337}, "uid:1337"},
		{Caller{UID: 5, ID: spiffeidOf("spiffe://a.test/ns/kube-system/sa/cilium")}, "spiffe://a.test/ns/kube-system/sa/cilium"},
		{Caller{UID: 0, ServiceAccount: "istio-system/istiod"}, ""},
		{Caller{UID: 5, ID: web}, ""},
		{Caller{UID: 5, ID: spiffeidOf("spiffe://a.test/ns/kube-system/sa/cilium"), Certified: true}, "spiffe://a.test/ns/kube-system/sa/cilium"},
	} {
		rule, ok := p.Allows(tc.c)
		assert.Equal(t, tc.rule, rule, "%s", tc.c)
		assert.Equal(t, tc.rule != "", ok)
	}
	assert.Equal(t, "sa:istio-system/ztunnel, uid:1337, spiffe://a.test/ns/kube-system/sa/cilium", p.String())
	assert.Equal(t, "pid 7 (uid 0, spiffe://a.test/ns/istio-system/sa/ztunnel (certificate))",
		Caller{PID: 7, ID: spiffeidOf("spiffe://a.test/ns/istio-system/sa/ztunnel"), Certified: true}.String())
	assert.Equal(t, "pid 7 (uid 0, service account istio-system/ztunnel, spiffe://a.test/ns/istio-system/sa/ztunnel)",
		Caller{PID: 7, ServiceAccount: "istio-system/ztunnel", ID: spiffeidOf("spiffe://a.test/ns/istio-system/sa/ztunnel")}.String())
	var none *Policy
	_, ok := none.Allows(Caller{})
	assert.False(t, ok)

	for text, want := range map[string]string{
		"sa:ztunnel":            "sa:<namespace>/<name>",
		"sa:Istio/ztunnel":      `namespace "Istio"`,
		"uid:root":              "uid:<number>",
		"uid:-1":                "uid:<number>",
		"spiffe://a.test/x/../": "",
		"group:wheel":           "want sa:",
		"":                      "want sa:",
	} {
		_, err := ParsePolicy([]string{text})
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want, text)
	}
	_, err = ParsePolicy(nil)
	require.ErrorContains(t, err, "--broker-allow")
}

// Untrusted bytes never panic the parser, and whatever it accepts is
// one well-formed reference.
func FuzzParseReference(f *testing.F) {
	for _, m := range []proto.Message{
		&brokerpb.WorkloadPIDReference{Pid: 42},
		&brokerpb.KubernetesObjectReference{Type: &brokerpb.KubernetesObjectType{Plural: "pods", Group: "core"}, Uid: webUID},
		&brokerpb.KubernetesObjectReference{Type: &brokerpb.KubernetesObjectType{Plural: "pods", Group: "core"}, Key: &brokerpb.KubernetesObjectKey{Namespace: "shop", Name: "web"}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(true, b)
		f.Add(false, b)
	}
	f.Add(false, spiffeReferencePod(f, "shop", "web", webUID).GetReference().GetValue())
	f.Fuzz(func(t *testing.T, pid bool, value []byte) {
		for _, typ := range []string{pidReferenceType, k8sReferenceType, pidReferenceTypeSPIRE, k8sReferenceTypeSPIRE} {
			if (typ == pidReferenceType || typ == pidReferenceTypeSPIRE) != pid {
				continue
			}
			checkParsed(t, typ, value)
		}
	})
}

func checkParsed(t *testing.T, typ string, value []byte) {
	r, err := ParseReference(&brokerpb.WorkloadReference{Reference: &anypb.Any{TypeUrl: typ, Value: value}})
	if err != nil {
		require.ErrorIs(t, err, ErrInvalidReference)
		return
	}
	switch {
	case r.Account != nil:
		require.Zero(t, r.PID)
		require.Nil(t, r.Pod)
		require.True(t, r.Account.Namespace != "" && r.Account.Name != "")
	case r.Pod == nil:
		require.Positive(t, r.PID)
	default:
		require.Zero(t, r.PID)
		require.True(t, r.Pod.UID != "" || (r.Pod.Name != "" && r.Pod.Namespace != ""))
	}
}

func FuzzParseDelegated(f *testing.F) {
	f.Add(int32(0), "k8s", "ns:shop", "k8s", "pod-name:web")
	f.Add(int32(0), "k8s", "pod-uid:"+webUID, "k8s", "pod-label:app:web")
	f.Add(int32(7), "", "", "", "")
	f.Fuzz(func(t *testing.T, pid int32, t1, v1, t2, v2 string) {
		var sels []*spiretypes.Selector
		if t1 != "" || v1 != "" {
			sels = append(sels, &spiretypes.Selector{Type: t1, Value: v1})
		}
		if t2 != "" || v2 != "" {
			sels = append(sels, &spiretypes.Selector{Type: t2, Value: v2})
		}
		r, err := ParseDelegated(pid, sels)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidReference)
			return
		}
		n := 0
		for _, set := range []bool{r.PID > 0, r.Pod != nil, r.Account != nil} {
			if set {
				n++
			}
		}
		require.Equal(t, 1, n, "exactly one kind of reference: %+v", r)
	})
}

func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{"sa:istio-system/ztunnel", "uid:0", "spiffe://a.test/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy([]string{s})
		if err != nil {
			return
		}
		require.Equal(t, s, p.String())
	})
}
