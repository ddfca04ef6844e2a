package hostcheck

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Config configures a Checker.
type Config struct {
	// Listen is the address the listener is bound to, as
	// net.Listener.Addr().String() gives it or as configured
	// ("127.0.0.1:15014", "[::]:15014", ":15014", "admin.local:15014").
	Listen string
	// Allowed are further names the listener is reached by ("name" or
	// "name:port"), e.g. a Kubernetes Service's DNS name.
	Allowed []string
	// Flag is the setting a refusal tells the operator to change.
	Flag string
	// OnRefuse, when set, hears of every refused request, for a log line
	// and a metric: an operator whose probe or proxy uses a name not
	// listed sees why it gets 421.
	OnRefuse func(r *http.Request)
}

// Checker decides whether a Host header names this listener.
type Checker struct {
	flag     string
	onRefuse func(*http.Request)
	anyIP    bool                // bound to every address
	bindIP   netip.Addr          // bound to one address; invalid otherwise
	loopback bool                // bound to loopback (or every address): localhost passes
	ips      map[netip.Addr]bool // addresses allowed besides the bind's
	names    map[string]bool     // lowercase names, any port
	namePort map[string]bool     // lowercase "name:port"
}

// New checks cfg and returns a Checker.
func New(cfg Config) (*Checker, error) {
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("hostcheck: listen address %q: %w", cfg.Listen, err)
	}
	c := &Checker{flag: cfg.Flag, onRefuse: cfg.OnRefuse, ips: map[netip.Addr]bool{}, names: map[string]bool{}, namePort: map[string]bool{}}
	if c.flag == "" {
		c.flag = "the allowed host names"
	}
	switch a, err := netip.ParseAddr(host); {
	case host == "" || err == nil && a.IsUnspecified():
		c.anyIP, c.loopback = true, true
	case err == nil:
		c.bindIP = a.WithZone("").Unmap()
		c.loopback = c.bindIP.IsLoopback()
	default:
		name := normalizeName(host)
		c.names[name] = true
		c.loopback = name == "localhost"
	}
	for _, entry := range cfg.Allowed {
		if err := c.allow(entry); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// allow adds one Config.Allowed entry.
func (c *Checker) allow(entry string) error {
	entry = strings.TrimSpace(entry)
	name, port, err := net.SplitHostPort(entry)
	if err != nil {
		name, port = entry, ""
	}
	if strings.ContainsAny(name, "/@ ") || strings.Trim(name, ".") == "" || strings.Contains(entry, "://") {
		return fmt.Errorf("hostcheck: allowed host %q: want a host name or name:port", entry)
	}
	if a, err := netip.ParseAddr(name); err == nil {
		// An address the listener is reached at through NAT, say.
		c.ips[a.WithZone("").Unmap()] = true
		return nil
	}
	if port == "" {
		c.names[normalizeName(name)] = true
	} else {
		c.namePort[normalizeName(name)+":"+port] = true
	}
	return nil
}

// normalizeName lowercases a name and drops the trailing dot of a fully
// qualified one.
func normalizeName(s string) string {
	return strings.TrimSuffix(strings.ToLower(s), ".")
}

// Allowed reports whether a request with this Host header is for this
// listener.
func (c *Checker) Allowed(hostHeader string) bool {
	if hostHeader == "" {
		return true
	}
	host, port, err := net.SplitHostPort(hostHeader)
	if err != nil {
		host, port = strings.TrimSuffix(strings.TrimPrefix(hostHeader, "["), "]"), ""
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return c.ipAllowed(a.WithZone("").Unmap())
	}
	name := normalizeName(host)
	switch {
	case name == "localhost" && c.loopback, c.names[name]:
		return true
	case port != "":
		return c.namePort[name+":"+port]
	}
	return false
}

func (c *Checker) ipAllowed(a netip.Addr) bool {
	switch {
	case c.anyIP, c.ips[a]:
		return true
	case c.bindIP.IsValid():
		return a == c.bindIP || c.loopback && a.IsLoopback()
	}
	// Bound by name: its addresses are not known here; loopback ones are
	// the only ones a "localhost" bind can be reached at.
	return c.loopback && a.IsLoopback()
}

// Wrap refuses, with 421 Misdirected Request, every request whose Host
// is not allowed, and passes the others to next.
func (c *Checker) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.Allowed(r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		if c.onRefuse != nil {
			c.onRefuse(r)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusMisdirectedRequest)
		fmt.Fprintf(w, "host %q is not a name of this listener (a DNS rebinding defence); if you reach it by this name, add it with %s\n",
			r.Host, c.flag)
	})
}
