// Command trustbridge-demo shows two trust domains federating on one
// machine (make demo): east.example serves its bundle over https_spiffe,
// west.example over https_web; each fetches the other's; a workload of
// each gets a certificate from its own CA; the two workloads talk mTLS,
// each verifying the other against the roots of the other's trust domain
// only; a workload of north.example, which neither trusts, is refused.
// Every process and file it makes is removed at the end, on failure and
// on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/trustbridge", "the trustbridge binary to run")
	flag.BoolVar(&o.keep, "keep", false, "keep the servers running after the demo, until Ctrl-C, to look around (/ui, /v1/snapshot, trustbridge audit)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

type options struct {
	bin  string
	keep bool
}
