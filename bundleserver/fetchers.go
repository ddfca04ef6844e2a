package bundleserver

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"
)

// Fetcher is a client of the bundle endpoint as its last fetch of one
// trust domain's bundle left it. Clients are told apart by their address
// alone: behind a load balancer or proxy that is the balancer's, and every
// peer behind it shares one Fetcher (X-Forwarded-For is not read: any
// client can write it).
type Fetcher struct {
	TrustDomain spiffeid.TrustDomain
	Client      string // the remote IP address, without port or zone
	// UserAgent is the last fetch's, at most 64 printable ASCII
	// characters: control characters dropped, others shown as '?'.
	UserAgent string
	LastFetch time.Time
	// Sequence is the spiffe_sequence of the document last served (0 when
	// it had none). A 304 Not Modified counts: the client's validator
	// matched the current document.
	Sequence uint64
	Fetches  uint64 // since the client entered the record
}

// Bounds of the record. An unauthenticated client can present any number
// of source addresses (an IPv6 /64 is 2^64 of them), so the record keeps
// the most recently seen and counts the others out
// (trustbridge_bundleserver_fetcher_evictions_total). The other trust
// domains' documents share one record, so that a relay of many cannot
// grow it and fetches of theirs never evict a fetcher of ours.
const (
	MaxLocalFetchers   = 256
	MaxRelayedFetchers = 1024
)

// maxUserAgent bounds Fetcher.UserAgent, in characters and bytes.
const maxUserAgent = 64

// Fetchers returns the clients that fetched td's bundle document with GET
// and were served it (200, or 304 Not Modified), most recent first: from
// the local path, /bundles/{td} or, for the local trust domain, the bundle
// map (a map fetch is recorded against our trust domain only, with our
// member's sequence). HEAD requests and the OIDC documents are not
// recorded. The record lives in memory and starts empty with the process.
func (s *Server) Fetchers(td spiffeid.TrustDomain) []Fetcher {
	if s.fetchers == nil {
		return nil
	}
	if td.Name() == s.localName {
		return s.fetchers.local.list(td)
	}
	return s.fetchers.relayed.list(td)
}

// fetchers is the record of both tables.
type fetchers struct {
	clk            clock.PassiveClock
	local, relayed *fetchLog
}

func newFetchers(reg prometheus.Registerer, clk clock.PassiveClock) (*fetchers, error) {
	evictions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustbridge_bundleserver_fetcher_evictions_total",
		Help: "Clients dropped from the bounded record of bundle fetchers to make room for another, by record (local: our trust domain's bundle; relayed: the others'). A steady rise means more clients than the record holds, or a flood of source addresses.",
	}, []string{"record"})
	if err := reg.Register(evictions); err != nil {
		return nil, err
	}
	return &fetchers{
		clk:     clk,
		local:   newFetchLog(MaxLocalFetchers, evictions.WithLabelValues("local")),
		relayed: newFetchLog(MaxRelayedFetchers, evictions.WithLabelValues("relayed")),
	}, nil
}

// fetched records a GET that is about to be answered with doc (200 or
// 304) on route. A nil s.fetchers (benchmarks' baseline) records nothing.
func (s *Server) fetched(r *http.Request, route int, doc *document) {
	f := s.fetchers
	if f == nil || r.Method != http.MethodGet {
		return
	}
	var td spiffeid.TrustDomain
	seq := doc.sequence
	switch route {
	case routeLocal, routeByName:
		td = doc.bundle.TrustDomain()
	case routeMap:
		// The map's document has no sequence of its own; its local member
		// is the snapshot's local document, unless an Update has replaced
		// the snapshot since, when what was served is unknown.
		snap := s.snap.Load()
		if snap.bundleMap != doc {
			return
		}
		td, seq = s.cfg.TrustDomain, snap.local.sequence
	default:
		return
	}
	addr, ok := remoteIP(r.RemoteAddr)
	if !ok {
		return
	}
	log := f.relayed
	if td.Name() == s.localName {
		log = f.local
	}
	log.record(fetchKey{td, addr}, userAgent(r.Header["User-Agent"]), seq, f.clk.Now())
}

// remoteIP is the address of a "host:port" RemoteAddr, IPv4-mapped IPv6
// addresses as IPv4 and without zone, so one client is one key.
func remoteIP(remote string) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap().WithZone(""), true
}

// userAgent is the first User-Agent line as Fetcher shows it. The common
// case, short and printable, is the header's own string.
func userAgent(values []string) string {
	if len(values) == 0 {
		return ""
	}
	v := values[0]
	if len(v) <= maxUserAgent && printable(v) {
		return v
	}
	var b strings.Builder
	b.Grow(min(len(v), maxUserAgent))
	for _, c := range v {
		switch {
		case b.Len() == maxUserAgent:
			return b.String()
		case c < ' ' || c == 0x7f:
		case c > '~':
			b.WriteByte('?')
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

func printable(s string) bool {
	for i := range len(s) {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

type fetchKey struct {
	td   spiffeid.TrustDomain
	addr netip.Addr
}

// fetchEntry is one client in a fetchLog's recency list.
type fetchEntry struct {
	key        fetchKey
	ua         string
	last       time.Time
	seq, n     uint64
	prev, next *fetchEntry
}

// fetchLog is a bounded least-recently-used record: a map to entries on a
// circular list, most recent after the sentinel. A fetch costs one map
// lookup and a few pointer moves under the lock; once full, the evicted
// entry is reused, so a flood of new addresses allocates nothing but map
// growth, which the bound caps.
type fetchLog struct {
	mu        sync.Mutex
	max       int
	byKey     map[fetchKey]*fetchEntry
	head      fetchEntry // sentinel: head.next is the most recent
	evictions prometheus.Counter
}

func newFetchLog(max int, evictions prometheus.Counter) *fetchLog {
	l := &fetchLog{max: max, byKey: make(map[fetchKey]*fetchEntry, max), evictions: evictions}
	l.head.prev, l.head.next = &l.head, &l.head
	return l
}

func (l *fetchLog) record(k fetchKey, ua string, seq uint64, now time.Time) {
	evicted := false
	l.mu.Lock()
	e := l.byKey[k]
	switch {
	case e != nil:
		e.unlink()
	case len(l.byKey) < l.max:
		e = &fetchEntry{key: k}
		l.byKey[k] = e
	default:
		e = l.head.prev
		e.unlink()
		delete(l.byKey, e.key)
		*e = fetchEntry{key: k}
		l.byKey[k] = e
		evicted = true
	}
	e.ua, e.last, e.seq = ua, now, seq
	e.n++
	e.prev, e.next = &l.head, l.head.next
	e.next.prev = e
	l.head.next = e
	l.mu.Unlock()
	if evicted {
		l.evictions.Inc()
	}
}

func (e *fetchEntry) unlink() {
	e.prev.next, e.next.prev = e.next, e.prev
}

// list copies td's entries under the lock, in recency order, and formats
// and sorts them outside it (a wall clock stepped back can disagree with
// the recency order).
func (l *fetchLog) list(td spiffeid.TrustDomain) []Fetcher {
	var seen []fetchEntry
	l.mu.Lock()
	for e := l.head.next; e != &l.head; e = e.next {
		if e.key.td == td {
			seen = append(seen, *e)
		}
	}
	l.mu.Unlock()
	if len(seen) == 0 {
		return nil
	}
	out := make([]Fetcher, len(seen))
	for i, e := range seen {
		out[i] = Fetcher{TrustDomain: td, Client: e.key.addr.String(), UserAgent: e.ua, LastFetch: e.last, Sequence: e.seq, Fetches: e.n}
	}
	slices.SortStableFunc(out, func(a, b Fetcher) int { return b.LastFetch.Compare(a.LastFetch) })
	return out
}
