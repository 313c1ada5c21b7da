//! The objects of an image-updater App as the API server returns them (the App, its Deployment
//! and its Service: uid, resourceVersion, creationTimestamp, generation, ownerReferences, the
//! defaulted spec fields, a status with two conditions; names and uids vary with `i`), shared by
//! the benches that feed them to the controller's caches and watches.

use serde_json::{Value, json};

pub fn uid(kind: u8, i: usize) -> String {
    format!("{kind:02x}6f1c2e-4b7a-4d2e-9c1a-{i:012x}")
}

pub fn owner(i: usize) -> Value {
    json!([{
        "apiVersion": "example.wasmop.dev/v1", "kind": "App", "name": format!("app-{i}"),
        "uid": uid(1, i), "controller": true, "blockOwnerDeletion": true
    }])
}

pub fn managed_fields() -> Value {
    json!([{
        "manager": "wasmop-image-updater", "operation": "Apply", "apiVersion": "apps/v1",
        "time": "2026-11-24T10:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:app.kubernetes.io/name": {}}}}
    }])
}

pub fn namespace_of(i: usize) -> String {
    format!("bench-{}", i % 100)
}

pub fn labels(i: usize) -> Value {
    json!({
        "app.kubernetes.io/name": format!("app-{i}"),
        "app.kubernetes.io/managed-by": "wasmop",
        "example.wasmop.dev/track": "stable"
    })
}

pub fn app(i: usize) -> Value {
    json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {
            "name": format!("app-{i}"), "namespace": namespace_of(i), "uid": uid(1, i),
            "resourceVersion": format!("{}", 100_000 + i), "generation": 1,
            "creationTimestamp": "2026-11-24T10:00:00Z",
            "finalizers": ["wasmop.dev/image-updater"],
            "managedFields": managed_fields()
        },
        "spec": {"image": format!("registry.example/app:{}", i % 7), "replicas": 1, "port": 8080, "track": "stable"},
        "status": {
            "observedGeneration": 1, "readyReplicas": 1, "image": format!("registry.example/app:{}", i % 7),
            "selector": format!("app.kubernetes.io/name=app-{i},example.wasmop.dev/track=stable"),
            "conditions": [
                {"type": "Available", "status": "True", "reason": "Available", "message": "all replicas run the image",
                 "lastTransitionTime": "2026-11-24T10:00:05Z", "observedGeneration": 1},
                {"type": "Progressing", "status": "False", "reason": "RolledOut", "message": "rolled out",
                 "lastTransitionTime": "2026-11-24T10:00:05Z", "observedGeneration": 1}
            ]
        }
    })
}

pub fn deployment(i: usize) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "name": format!("app-{i}"), "namespace": namespace_of(i), "uid": uid(2, i),
            "resourceVersion": format!("{}", 200_000 + i), "generation": 1,
            "creationTimestamp": "2026-11-24T10:00:01Z",
            "labels": labels(i),
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "ownerReferences": owner(i),
            "managedFields": managed_fields()
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": format!("app-{i}"), "example.wasmop.dev/track": "stable"}},
            "template": {
                "metadata": {"labels": labels(i)},
                "spec": {
                    "containers": [{
                        "name": "app", "image": format!("registry.example/app:{}", i % 7),
                        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                        "resources": {},
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File",
                        "imagePullPolicy": "IfNotPresent"
                    }],
                    "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                    "dnsPolicy": "ClusterFirst", "securityContext": {}, "schedulerName": "default-scheduler"
                }
            },
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
            "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600
        },
        "status": {
            "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
            "availableReplicas": 1,
            "conditions": [
                {"type": "Available", "status": "True", "lastUpdateTime": "2026-11-24T10:00:04Z",
                 "lastTransitionTime": "2026-11-24T10:00:04Z", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability."},
                {"type": "Progressing", "status": "True", "lastUpdateTime": "2026-11-24T10:00:04Z",
                 "lastTransitionTime": "2026-11-24T10:00:01Z", "reason": "NewReplicaSetAvailable",
                 "message": format!("ReplicaSet \"app-{i}-5d8f9c7b6d\" has successfully progressed.")}
            ]
        }
    })
}

pub fn service(i: usize) -> Value {
    let ip = format!("10.96.{}.{}", (i / 250) % 250, i % 250 + 1);
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": format!("app-{i}"), "namespace": namespace_of(i), "uid": uid(3, i),
            "resourceVersion": format!("{}", 300_000 + i),
            "creationTimestamp": "2026-11-24T10:00:01Z",
            "labels": labels(i),
            "ownerReferences": owner(i),
            "managedFields": managed_fields()
        },
        "spec": {
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"}],
            "selector": {"app.kubernetes.io/name": format!("app-{i}"), "example.wasmop.dev/track": "stable"},
            "clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP", "sessionAffinity": "None",
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"
        },
        "status": {"loadBalancer": {}}
    })
}
