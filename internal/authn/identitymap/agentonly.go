package identitymap

import (
	"fmt"
	"strings"
)

// AgentOnlyRule is a rule only a node agent can evaluate: it selects by
// unix facts or its templates use facts the Kubernetes API does not hold
// (the container, the caller's uid, gid, user or group).
type AgentOnlyRule struct {
	RuleRef
	// Needs lists those facts: "uid", "binaryPath", "{{.ContainerName}}".
	Needs   []string `json:"needs"`
	Message string   `json:"message"`
}

// AgentOnly lists the rules only a node agent can evaluate, in rule
// order. The server checks a node agent's request for a pod's identity
// against the map with the pod's facts from the API server (ServerFacts):
// such a rule never selects a pod there (its unix fields find no unix
// facts) or fails it (ErrFacts), so the server never grants its IDs.
// Status pages, audit findings and explanations say so before a request
// fails.
func (m *Map) AgentOnly() []AgentOnlyRule {
	if m == nil {
		return nil
	}
	var out []AgentOnlyRule
	for i := range m.rules {
		r := &m.rules[i]
		needs := r.agentFacts()
		if len(needs) == 0 {
			continue
		}
		out = append(out, AgentOnlyRule{
			RuleRef: RuleRef{Name: r.Name, Origin: r.Origin}, Needs: needs,
			Message: fmt.Sprintf("rule %q (%s) needs %s, which only the node agent attests: the server cannot check it for a pod, so it never grants the IDs it makes to a node agent (fail closed); select pods by namespace, serviceAccount and podLabels and use only their facts in templates",
				r.Name, r.Origin, strings.Join(needs, ", ")),
		})
	}
	return out
}

// agentFacts lists the facts of r the API server does not hold.
func (r *compiledRule) agentFacts() []string {
	var out []string
	add := func(s string) {
		for _, x := range out {
			if x == s {
				return
			}
		}
		out = append(out, s)
	}
	for _, s := range r.selectors {
		for _, f := range s.fields() {
			switch f {
			case "uid", "gid", "binaryPath", "binarySHA256":
				add(f)
			}
		}
	}
	for _, t := range append([]*template{r.id}, r.dns...) {
		for _, p := range t.parts {
			if f, ok := facts[p.fact]; ok && (!f.kube || p.fact == "ContainerName") {
				add(p.text())
			}
		}
	}
	return out
}

// ServerFacts is a pod as the server knows it from the API server: its
// Kubernetes facts without the container and no unix facts. labels may be
// nil for a pod without labels.
func ServerFacts(namespace, serviceAccount, podName, podUID, nodeName string, labels map[string]string) Workload {
	if labels == nil {
		labels = map[string]string{}
	}
	return Workload{Kubernetes: true, Namespace: namespace, ServiceAccount: serviceAccount, PodName: podName,
		PodUID: podUID, NodeName: nodeName, PodLabels: labels}
}
