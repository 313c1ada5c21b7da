// Command scale-controller-runtime is the image-updater logic as a controller-runtime operator:
// what most operator authors write today. It is one contender of `make bench-scale`
// (bench/scale): an App (example.wasmop.dev/v1) becomes a Deployment and a Service, applied by
// server-side apply with wasmop's field manager, and a status with the conditions Available and
// Progressing, applied to the status subresource; the same finalizer, Events and resync as the
// other contenders.
//
// Usage: scale-controller-runtime --namespace=demo --concurrency=16 --resync=30s, with
// KUBECONFIG set. Prints READY on stdout once the caches are synced. The client has no
// client-side rate limit (QPS -1).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// AppGVK is the App's group, version and kind.
var AppGVK = schema.GroupVersionKind{Group: "example.wasmop.dev", Version: "v1", Kind: "App"}

func main() {
	namespace := flag.String("namespace", "demo", "the namespace of the Apps")
	concurrency := flag.Int("concurrency", 16, "reconciles at once (MaxConcurrentReconciles)")
	resync := flag.Duration("resync", 30*time.Second, "the resync period (SyncPeriod)")
	flag.Parse()
	if err := run(*namespace, *concurrency, *resync); err != nil {
		fmt.Fprintf(os.Stderr, "scale-controller-runtime: %v\n", err)
		os.Exit(1)
	}
}

func run(namespace string, concurrency int, resync time.Duration) error {
	config, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// No client-side rate limit, like kube-rs (client-go's default is 5 QPS, controller-runtime's 20).
	config.QPS = -1
	config.Burst = 0
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(config, manager.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{namespace: {}},
			SyncPeriod:        &resync,
		},
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	app := &unstructured.Unstructured{}
	app.SetGroupVersionKind(AppGVK)
	reconciler := &Reconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("image-updater"),
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("image-updater").
		For(app).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(reconciler)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	go func() {
		if mgr.GetCache().WaitForCacheSync(ctx) {
			fmt.Println("READY")
		}
	}()
	return mgr.Start(ctx)
}
