// Package health is trustbridge healthcheck and trustbridge agent
// healthcheck: exit 0 when the server (or the node agent) is live and
// ready, non-zero saying why not, as spire-server healthcheck and
// spire-agent healthcheck do, for scripts, systemd and exec probes.
package health
