// A hook that throws (its promise rejects).
function check(parent) {
  if (!parent.spec) throw new TypeError(`${parent.metadata.name} has no spec`);
}

module.exports = async function (context) {
  check(context.request.body.parent);
  return { status: 200, body: {} };
};
