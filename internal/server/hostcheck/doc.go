// Package hostcheck refuses HTTP requests whose Host header names neither
// the listener nor a name its operator allowed: a defence against DNS
// rebinding, where a web page on attacker.example re-resolves its own name
// to 127.0.0.1 (or a pod IP) and reads a listener meant for local callers
// with the victim browser's network position. The browser still sends
// Host: attacker.example, so checking the name is enough.
//
//	chk, err := hostcheck.New(hostcheck.Config{Listen: ln.Addr().String(), Allowed: names, Flag: "--admin-allowed-hosts"})
//	srv := &http.Server{Handler: chk.Wrap(mux)}
//
// What passes:
//   - an IP literal, with any port: a literal cannot be rebound. When the
//     listener is bound to one address, only that address (and, for a
//     loopback bind, any loopback address); bound to 0.0.0.0 or ::, any
//     address, since Kubernetes probes and scrapes send Host: <pod IP>:port.
//   - "localhost" (and "localhost."), with any port, when the listener is
//     bound to loopback or to every address: browsers resolve it to
//     loopback themselves, so a page of another origin cannot send it.
//   - the listener's own host name, when it was bound by name.
//   - each Config.Allowed entry: "name" for any port, "name:port" for that
//     port only, or an IP address (with any port).
//   - an empty Host (HTTP/1.0): no browser sends one.
//
// Ports of IP literals and localhost are not compared with the bind port:
// kubectl port-forward and a Service's port mapping change the port the
// client saw, and the port adds nothing against rebinding.
//
// See RFC 9110 §7.2 (Host), §15.5.20 (421 Misdirected Request).
package hostcheck
