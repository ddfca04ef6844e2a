// Package rulesource keeps what a combiner of rules from several sources
// (a polled file, the --config file, Kubernetes resources) needs to know
// of each: its last good rules and default, its Status, and the reload
// metrics that follow them. The trust policy (internal/trustpolicy) and
// the identity map (internal/authn/identitymap) each combine their
// sources this way; each keeps its own compiling and publishing, and
// defines its own metric names. A FileSource polls one rules file into
// such a combiner, keeping the last good rules on a bad change; each
// user sets its parser and the words of its logs and errors.
//
//	src := rulesource.New[Rule, Default](clock, metrics)
//	if src.Unchanged(source, rules, def) {
//		return nil // clear the error, wake nobody
//	}
//	compiled, err := compile(...) // every src.Names(source), src.Rules(name)
//	if err != nil {
//		return src.Fail(source, err)
//	}
//	src.Set(source, rules, def)
//
//	file := rulesource.NewFileSource(rulesource.FileConfig[Document]{
//		Path: path, Combiner: comb, Parse: Parse, Rules: count, MaxSize: 1 << 20,
//		ErrorPrefix: "pkg: rules file", LogName: "rules file", Logger: logger,
//	})
//	err := file.Load() // then go file.Run(ctx)
package rulesource
