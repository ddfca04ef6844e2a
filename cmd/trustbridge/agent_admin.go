package main

import (
	"github.com/trustbridge/trustbridge/internal/agent"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/internal/server"
)

// addAgentAdminFlags registers the agent's admin listener flags. Off by
// default: the agent runs beside a workload, often next to an Istio agent
// (15020, 15021) or several to a node, where an unasked-for port collides.
func addAgentAdminFlags(f *pflag.FlagSet, o *agent.AdminConfig) {
	f.StringVar(&o.Listen, "admin-listen", "", `address of the agent's admin HTTP listener (/healthz; /readyz: 200 once SDS serves a certificate; /metrics), e.g. 127.0.0.1:15022; "" (the default): none`)
	f.StringSliceVar(&o.Hosts, server.AdminHostsFlag, nil, "more host names the admin listener is reached by, NAME or NAME:PORT; a request naming another host gets 421, as on the server's (repeatable)")
	server.AdminLimits.AddFlags(f, &o.Conns, "admin", "the kubelet's probes and Prometheus", "")
}
