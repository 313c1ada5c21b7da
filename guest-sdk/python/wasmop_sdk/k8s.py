"""The kinds of the Kubernetes API a module most often owns or reads, as ``Gvk`` constants."""

from .kinds import Gvk

NAMESPACE = Gvk("v1", "Namespace")
CONFIG_MAP = Gvk("v1", "ConfigMap")
SECRET = Gvk("v1", "Secret")
SERVICE = Gvk("v1", "Service")
SERVICE_ACCOUNT = Gvk("v1", "ServiceAccount")
POD = Gvk("v1", "Pod")
PERSISTENT_VOLUME_CLAIM = Gvk("v1", "PersistentVolumeClaim")
RESOURCE_QUOTA = Gvk("v1", "ResourceQuota")
LIMIT_RANGE = Gvk("v1", "LimitRange")
DEPLOYMENT = Gvk("apps/v1", "Deployment")
STATEFUL_SET = Gvk("apps/v1", "StatefulSet")
DAEMON_SET = Gvk("apps/v1", "DaemonSet")
JOB = Gvk("batch/v1", "Job")
CRON_JOB = Gvk("batch/v1", "CronJob")
NETWORK_POLICY = Gvk("networking.k8s.io/v1", "NetworkPolicy")
INGRESS = Gvk("networking.k8s.io/v1", "Ingress")
ROLE = Gvk("rbac.authorization.k8s.io/v1", "Role")
ROLE_BINDING = Gvk("rbac.authorization.k8s.io/v1", "RoleBinding")
