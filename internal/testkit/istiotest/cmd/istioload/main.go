// Command istioload calls trustbridge's IstioCertificateService/CreateCertificate
// through Istio's own CA client, the istio-agent's citadel client
// (istio.io/istio/security/pkg/nodeagent/caclient/providers/citadel), from
// its own process, so that the clients never share the server's goroutines,
// scheduler or heap. BenchmarkIstioClientThroughput builds and runs it.
//
// Each of -clients clients is its own citadel client with its own gRPC
// connection, authenticated with the bootstrap token in -token-file as the
// agent sends its service account token. Before the clock starts, every
// client makes one untimed call (TLS handshake, HTTP/2 setup) and, unless
// -fresh-csr, its key and CSR are generated once with Istio's pkiutil.GenCSR
// and sent on every call: the figure is then the CA's throughput, not the
// client's key generation. With -fresh-csr each call first generates a new
// key and CSR, as the agent's secret cache does for every certificate.
//
// It prints one line of JSON: clients, certs, seconds, certs_per_s and the
// process's own CPU time per certificate (cpu_us_per_cert, user+system over
// the timed part).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"istio.io/istio/pkg/log"
	"istio.io/istio/pkg/security"
	"istio.io/istio/security/pkg/credentialfetcher/plugin"
	"istio.io/istio/security/pkg/nodeagent/caclient/providers/citadel"
	pkiutil "istio.io/istio/security/pkg/pki/util"
)

type config struct {
	addr, san, rootCert, tokenFile  string
	trustDomain, namespace, account string
	clients, certs                  int
	freshCSR                        bool
	ttl                             time.Duration
}

// result is the line printed on success.
type result struct {
	Clients       int     `json:"clients"`
	Certs         int     `json:"certs"`
	Seconds       float64 `json:"seconds"`
	CertsPerS     float64 `json:"certs_per_s"`
	CPUMicrosCert float64 `json:"cpu_us_per_cert"`
	FreshCSR      bool    `json:"fresh_csr"`
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", "", "the CA's gRPC address (the agent's CA_ADDR), host:port")
	flag.StringVar(&c.san, "san", "localhost", "name the CA's serving certificate carries (the agent's ISTIOD_SAN)")
	flag.StringVar(&c.rootCert, "root-cert", "", "PEM file of the roots that verify the CA's serving certificate")
	flag.StringVar(&c.tokenFile, "token-file", "", "file holding the bearer token sent on every call")
	flag.StringVar(&c.trustDomain, "trust-domain", "example.org", "trust domain of the requested identity")
	flag.StringVar(&c.namespace, "namespace", "default", "namespace of the requested identity")
	flag.StringVar(&c.account, "service-account", "web", "service account of the requested identity")
	flag.IntVar(&c.clients, "clients", 1, "concurrent clients, each with its own connection")
	flag.IntVar(&c.certs, "n", 1000, "certificates to request in the timed part, over all clients")
	flag.BoolVar(&c.freshCSR, "fresh-csr", false, "generate a new key and CSR for every call, as the agent does")
	flag.DurationVar(&c.ttl, "ttl", time.Hour, "requested certificate lifetime")
	flag.Parse()
	res, err := run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "istioload:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "istioload:", err)
		os.Exit(1)
	}
}

func run(c config) (result, error) {
	if c.addr == "" || c.rootCert == "" || c.tokenFile == "" {
		return result{}, errors.New("-addr, -root-cert and -token-file are required")
	}
	if c.clients < 1 || c.certs < 1 {
		return result{}, fmt.Errorf("-clients %d and -n %d must be at least 1", c.clients, c.certs)
	}
	// The citadel client logs every failed call at error level; keep them,
	// on stderr, since stdout carries the result, but not the info chatter.
	opts := log.DefaultOptions()
	opts.OutputPaths = []string{"stderr"}
	opts.SetDefaultOutputLevel(log.OverrideScopeName, log.WarnLevel)
	if err := log.Configure(opts); err != nil {
		return result{}, err
	}

	workers := make([]*worker, c.clients)
	for i := range workers {
		w, err := newWorker(c)
		if err != nil {
			return result{}, fmt.Errorf("client %d: %w", i, err)
		}
		defer w.client.Close()
		workers[i] = w
	}
	// Warm-up, untimed: every connection handshakes and serves one call.
	for i, w := range workers {
		if err := w.call(); err != nil {
			return result{}, fmt.Errorf("client %d: warm-up: %w", i, err)
		}
	}

	var next atomic.Int64
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	start := time.Now()
	for i, w := range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(c.certs) {
				if err := w.call(); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	return result{
		Clients:       c.clients,
		Certs:         c.certs,
		Seconds:       elapsed.Seconds(),
		CertsPerS:     float64(c.certs) / elapsed.Seconds(),
		CPUMicrosCert: float64(cpu.Microseconds()) / float64(c.certs),
		FreshCSR:      c.freshCSR,
	}, nil
}

// worker is one istio-agent's CA client.
type worker struct {
	client   *citadel.CitadelClient
	csrOpts  pkiutil.CertOptions
	csr      []byte // reused on every call unless freshCSR
	freshCSR bool
	ttl      int64
}

func newWorker(c config) (*worker, error) {
	opts := &security.Options{
		CAEndpoint:        c.addr,
		CAEndpointSAN:     c.san,
		TrustDomain:       c.trustDomain,
		WorkloadNamespace: c.namespace,
		ServiceAccount:    c.account,
		ClusterID:         "Kubernetes",
		ECCSigAlg:         "ECDSA",
		CredFetcher:       plugin.CreateTokenPlugin(c.tokenFile),
	}
	client, err := citadel.NewCitadelClient(opts, &citadel.TLSOptions{RootCert: c.rootCert})
	if err != nil {
		return nil, err
	}
	w := &worker{
		client: client,
		// What the agent's secret cache asks for: an ECDSA P-256 key and
		// the workload's SPIFFE ID as the CSR's only SAN.
		csrOpts: pkiutil.CertOptions{
			Host:     fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", c.trustDomain, c.namespace, c.account),
			ECSigAlg: pkiutil.EcdsaSigAlg,
			ECCCurve: pkiutil.P256Curve,
		},
		freshCSR: c.freshCSR,
		ttl:      int64(c.ttl.Seconds()),
	}
	if w.csr, _, err = pkiutil.GenCSR(w.csrOpts); err != nil {
		client.Close()
		return nil, err
	}
	return w, nil
}

func (w *worker) call() error {
	csr := w.csr
	if w.freshCSR {
		var err error
		if csr, _, err = pkiutil.GenCSR(w.csrOpts); err != nil {
			return err
		}
	}
	chain, err := w.client.CSRSign(csr, w.ttl)
	if err != nil {
		return err
	}
	if len(chain) < 2 {
		return fmt.Errorf("cert_chain of %d elements, want a leaf and roots", len(chain))
	}
	return nil
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
