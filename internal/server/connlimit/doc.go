// Package connlimit bounds the connections a TCP listener holds: in total
// and per source (an IPv4 address, or an IPv6 /64 as a whole). A
// connection over either limit is closed at accept, with a reset, before
// it costs a goroutine, a TLS handshake or a buffer; it is counted in
// trustbridge_listener_connections_refused_total and logged at a bounded
// rate (internal/ratelimit). golang.org/x/net/netutil.LimitListener instead
// stops accepting at its limit, which leaves every new client, legitimate
// or not, waiting in the kernel's backlog, and it knows no sources.
//
// A Listener can also close a connection that nobody confirms within a
// deadline of its accept (Config.ConfirmWithin): the certificate service
// confirms a connection when a call on it succeeds, so a client that
// completes TLS and the HTTP/2 preface and then says nothing, or makes
// only calls that fail, holds its slot for seconds, not for the server's
// 15-minute idle limit. Until confirmed, a connection may have only
// Config.PendingStreams calls open (OpenStream, from gRPC's InTapHandle),
// and such connections have shares of their own (Config.MaxPending, the
// oldest closed to admit a new one, and Config.MaxPendingPerSource), so
// that clients that never confirm neither exhaust memory with calls nor
// fill the total.
//
//	ln, err := net.Listen("tcp", ":15012")
//	...
//	cl, err := connlimit.New(ln, connlimit.Config{
//		Name: "grpc", MaxConns: 2048, MaxPerSource: 512, ConfirmWithin: 30 * time.Second,
//		PendingStreams: 4, MaxPending: 512, MaxPendingPerSource: 64,
//		Logger: logger, Registerer: reg,
//	})
//	...
//	// once a call on it has succeeded:
//	if p, ok := peer.FromContext(ctx); ok {
//		cl.Confirm(p.Addr, p.LocalAddr)
//	}
//
// Sources are IPv6 /64s because a host's interface identifier is the low
// 64 bits (RFC 4291 §2.5.1) and a host picks new ones at will (RFC 8981
// temporary addresses): counting addresses would give one host as many
// slots as it likes.
package connlimit
