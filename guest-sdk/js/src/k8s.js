// The kinds of the Kubernetes API a module most often owns or reads, as `Gvk` constants.
import { Gvk } from './kinds.js';

export const NAMESPACE = new Gvk('v1', 'Namespace');
export const CONFIG_MAP = new Gvk('v1', 'ConfigMap');
export const SECRET = new Gvk('v1', 'Secret');
export const SERVICE = new Gvk('v1', 'Service');
export const SERVICE_ACCOUNT = new Gvk('v1', 'ServiceAccount');
export const POD = new Gvk('v1', 'Pod');
export const PERSISTENT_VOLUME_CLAIM = new Gvk('v1', 'PersistentVolumeClaim');
export const RESOURCE_QUOTA = new Gvk('v1', 'ResourceQuota');
export const LIMIT_RANGE = new Gvk('v1', 'LimitRange');
export const DEPLOYMENT = new Gvk('apps/v1', 'Deployment');
export const STATEFUL_SET = new Gvk('apps/v1', 'StatefulSet');
export const DAEMON_SET = new Gvk('apps/v1', 'DaemonSet');
export const JOB = new Gvk('batch/v1', 'Job');
export const CRON_JOB = new Gvk('batch/v1', 'CronJob');
export const NETWORK_POLICY = new Gvk('networking.k8s.io/v1', 'NetworkPolicy');
export const INGRESS = new Gvk('networking.k8s.io/v1', 'Ingress');
export const ROLE = new Gvk('rbac.authorization.k8s.io/v1', 'Role');
export const ROLE_BINDING = new Gvk('rbac.authorization.k8s.io/v1', 'RoleBinding');
