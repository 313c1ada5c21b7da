package main

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

const (
	// FieldManager is wasmop's field manager for this reconciler.
	FieldManager = "wasmop/image-updater"
	// Finalizer is the finalizer the operators put on Apps.
	Finalizer = "wasmop.dev/image-updater"
	// ReconcilerLabel marks the children (wasmop's label).
	ReconcilerLabel = "wasmop.dev/reconciler"
)

// Reconciler turns Apps into Deployments and Services.
type Reconciler struct {
	client.Client
	Recorder events.EventRecorder
}

// Spec is an App's spec with the CRD's defaults.
type Spec struct {
	Image    string
	Replicas int32
	Port     int32
	Track    string
}

func specOf(app *unstructured.Unstructured) Spec {
	s := Spec{Replicas: 1, Port: 8080, Track: "stable"}
	s.Image, _, _ = unstructured.NestedString(app.Object, "spec", "image")
	if v, ok, _ := unstructured.NestedInt64(app.Object, "spec", "replicas"); ok {
		s.Replicas = int32(v)
	}
	if v, ok, _ := unstructured.NestedInt64(app.Object, "spec", "port"); ok {
		s.Port = int32(v)
	}
	if v, ok, _ := unstructured.NestedString(app.Object, "spec", "track"); ok {
		s.Track = v
	}
	return s
}

func labels(name string, s Spec) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       name,
		"app.kubernetes.io/managed-by": "wasmop",
		"example.wasmop.dev/track":     s.Track,
	}
}

func selector(name string, s Spec) map[string]string {
	return map[string]string{"app.kubernetes.io/name": name, "example.wasmop.dev/track": s.Track}
}

func owner(app *unstructured.Unstructured) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion("example.wasmop.dev/v1").WithKind("App").
		WithName(app.GetName()).WithUID(app.GetUID()).
		WithController(true).WithBlockOwnerDeletion(true)
}

func childLabels(name string, s Spec) map[string]string {
	l := labels(name, s)
	l[ReconcilerLabel] = "image-updater"
	return l
}

func deployment(app *unstructured.Unstructured, s Spec) *appsv1ac.DeploymentApplyConfiguration {
	name := app.GetName()
	return appsv1ac.Deployment(name, app.GetNamespace()).
		WithLabels(childLabels(name, s)).
		WithOwnerReferences(owner(app)).
		WithSpec(appsv1ac.DeploymentSpec().
			WithReplicas(s.Replicas).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selector(name, s))).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(labels(name, s)).
				WithSpec(corev1ac.PodSpec().WithContainers(corev1ac.Container().
					WithName("app").
					WithImage(s.Image).
					WithPorts(corev1ac.ContainerPort().WithContainerPort(s.Port).WithName("http"))))))
}

func service(app *unstructured.Unstructured, s Spec) *corev1ac.ServiceApplyConfiguration {
	name := app.GetName()
	return corev1ac.Service(name, app.GetNamespace()).
		WithLabels(childLabels(name, s)).
		WithOwnerReferences(owner(app)).
		WithSpec(corev1ac.ServiceSpec().
			WithSelector(selector(name, s)).
			WithPorts(corev1ac.ServicePort().WithName("http").WithPort(80).
				WithTargetPort(intstr.FromString("http"))))
}

func conditionOf(d *appsv1.Deployment, t appsv1.DeploymentConditionType) corev1.ConditionStatus {
	for _, c := range d.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// condition is one status condition (as image-updater reports it).
type condition struct{ Type, Status, Reason, Message string }

// status computes image-updater's status fields and conditions.
func status(name string, s Spec, observed *appsv1.Deployment) (map[string]interface{}, []condition) {
	var ready, updated, replicas int32
	if observed != nil {
		ready, updated, replicas = observed.Status.ReadyReplicas, observed.Status.UpdatedReplicas, observed.Status.Replicas
	}
	sel := fmt.Sprintf("app.kubernetes.io/name=%s,example.wasmop.dev/track=%s", name, s.Track)
	fields := map[string]interface{}{
		"replicas": int64(s.Replicas), "readyReplicas": int64(ready), "updatedReplicas": int64(updated),
		"image": s.Image, "selector": sel,
	}
	if observed == nil {
		return fields, []condition{
			{"Available", "False", "DeploymentCreating", "the Deployment is being created"},
			{"Progressing", "True", "DeploymentCreating", "the Deployment is being created"},
		}
	}
	image := ""
	if cs := observed.Spec.Template.Spec.Containers; len(cs) > 0 {
		image = cs[0].Image
	}
	rolledOut := image == s.Image && observed.Status.ObservedGeneration >= observed.Generation &&
		updated >= s.Replicas && ready >= s.Replicas && replicas == s.Replicas
	msg := fmt.Sprintf("%d/%d replicas ready", ready, s.Replicas)
	available := condition{"Available", "False", "MinimumReplicasUnavailable", msg}
	if conditionOf(observed, appsv1.DeploymentAvailable) == corev1.ConditionTrue {
		available = condition{"Available", "True", "MinimumReplicasAvailable", msg}
	}
	progressing := condition{"Progressing", "True", "RollingOut",
		fmt.Sprintf("%d/%d replicas updated to %s", updated, s.Replicas, s.Image)}
	if rolledOut {
		progressing = condition{"Progressing", "False", "RolloutComplete", "all replicas run " + s.Image}
	}
	return fields, []condition{available, progressing}
}

// statusObject is the status to write: lastTransitionTime kept while a condition's status holds.
func statusObject(app *unstructured.Unstructured, fields map[string]interface{}, conds []condition) map[string]interface{} {
	previous, _, _ := unstructured.NestedSlice(app.Object, "status", "conditions")
	since := func(t, s string) string {
		for _, p := range previous {
			if m, ok := p.(map[string]interface{}); ok && m["type"] == t && m["status"] == s {
				if v, ok := m["lastTransitionTime"].(string); ok {
					return v
				}
			}
		}
		return time.Now().UTC().Format(time.RFC3339)
	}
	generation := app.GetGeneration()
	list := make([]interface{}, 0, len(conds))
	for _, c := range conds {
		list = append(list, map[string]interface{}{
			"type": c.Type, "status": c.Status, "reason": c.Reason, "message": c.Message,
			"lastTransitionTime": since(c.Type, c.Status), "observedGeneration": generation,
		})
	}
	out := map[string]interface{}{}
	for k, v := range fields {
		out[k] = v
	}
	out["conditions"] = list
	out["observedGeneration"] = generation
	return out
}

// unchanged reports whether every field of wanted is already in the App's status.
func unchanged(app *unstructured.Unstructured, wanted map[string]interface{}) bool {
	current, ok, _ := unstructured.NestedMap(app.Object, "status")
	if !ok {
		return false
	}
	for k, v := range wanted {
		if fmt.Sprint(normalize(current[k])) != fmt.Sprint(normalize(v)) {
			return false
		}
	}
	return true
}

// normalize makes JSON numbers and Go integers print alike.
func normalize(v interface{}) interface{} {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float64:
		return int64(x)
	case []interface{}:
		out := make([]interface{}, len(x))
		for i := range x {
			out[i] = normalize(x[i])
		}
		return out
	case map[string]interface{}:
		out := map[string]interface{}{}
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	}
	return v
}

// Reconcile applies an App's children and status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	app := &unstructured.Unstructured{}
	app.SetGroupVersionKind(AppGVK)
	if err := r.Get(ctx, req.NamespacedName, app); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !app.GetDeletionTimestamp().IsZero() {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app.GetName(), Namespace: app.GetNamespace()}}
		if err := r.Delete(ctx, svc); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		if controllerutil.RemoveFinalizer(app, Finalizer) {
			return ctrl.Result{}, r.Update(ctx, app)
		}
		return ctrl.Result{}, nil
	}
	if controllerutil.AddFinalizer(app, Finalizer) {
		if err := r.Update(ctx, app); err != nil {
			return ctrl.Result{}, err
		}
	}
	s := specOf(app)
	var observed *appsv1.Deployment
	var d appsv1.Deployment
	if err := r.Get(ctx, types.NamespacedName{Namespace: app.GetNamespace(), Name: app.GetName()}, &d); err == nil {
		if metav1.IsControlledBy(&d, app) {
			observed = &d
		}
	} else if !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	opts := []client.ApplyOption{client.FieldOwner(FieldManager), client.ForceOwnership}
	if err := r.Apply(ctx, deployment(app, s), opts...); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Apply(ctx, service(app, s), opts...); err != nil {
		return ctrl.Result{}, err
	}
	if observed == nil {
		r.Recorder.Eventf(app, nil, corev1.EventTypeNormal, "Creating", "Create",
			"creating Deployment and Service %s", app.GetName())
	} else if cs := observed.Spec.Template.Spec.Containers; len(cs) > 0 && cs[0].Image != s.Image {
		r.Recorder.Eventf(app, nil, corev1.EventTypeNormal, "RollingOut", "Rollout",
			"image %s -> %s", cs[0].Image, s.Image)
	}
	fields, conds := status(app.GetName(), s, observed)
	wanted := statusObject(app, fields, conds)
	if !unchanged(app, wanted) {
		body := &unstructured.Unstructured{Object: map[string]interface{}{"status": wanted}}
		body.SetGroupVersionKind(AppGVK)
		body.SetName(app.GetName())
		body.SetNamespace(app.GetNamespace())
		err := r.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body),
			client.FieldOwner(FieldManager), client.ForceOwnership)
		if err != nil {
			return ctrl.Result{}, err
		}
	}
	// image-updater looks again in 5 s while a rollout is in progress; otherwise the manager's
	// SyncPeriod is the resync.
	for _, c := range conds {
		if c.Type == "Progressing" && c.Status == "True" {
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
	}
	return ctrl.Result{}, nil
}
