// Package fileutil holds what trustbridge does with the local files it is
// configured with. Reloader keeps the last good value parsed from files
// that change on disk (Kubernetes Secret and ConfigMap volumes, an
// operator's cp), polling them and reporting a bad change once while it
// persists.
//
//	r := fileutil.NewReloader(fileutil.ReloaderConfig[[]byte, *Doc]{
//		Read:   func() ([]byte, error) { return os.ReadFile(path) },
//		Digest: sha256.Sum256,
//		Parse:  func(b []byte, _ *Doc, _ bool) (*Doc, error) { return parse(b) },
//	})
//	if err := r.Load(); err != nil {
//		return err
//	}
//	return r.Run(ctx, nil, 10*time.Second)
package fileutil
